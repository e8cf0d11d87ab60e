"""`objective=orpo`: ORPO, odds ratio preference optimization (Hong et al. 2024), reference-free: the chosen
answers' negative log-likelihood plus an odds-ratio term, as TRL 1.16's experimental ORPOTrainer computes it
(trl/experimental/orpo/orpo_trainer.py: log1mexp :87, odds_ratio_loss :670-702, the NLL :781-800, the loss and
its metrics :848-869):

  loss      nll - mean over pairs of beta log sigmoid(log_odds)
  log_odds  (a_c - a_r) - (log(1 - exp(a_c)) - log(1 - exp(a_r)))

a_c, a_r: the chosen and rejected completions' log-probs averaged over their tokens, in float32 as TRL's, with
log(1 - exp(a)) computed without cancellation. Rewards: beta times each average; logps/*: the averages; and TRL's
nll_loss, log_odds_ratio (the mean log sigmoid(log_odds)) and log_odds_chosen (the mean log_odds).

The NLL is TRL's, not the paper's: over each chosen sequence WHOLE, its prompt as well as its completion (TRL's
labels are the input ids wherever attended), every token but the first. The rows carry completion-only targets
(what the other pair objectives score), so `prepare` adds the chosen rows' prompt targets from the inputs they
already hold, in the targets themselves (below IGNORE_INDEX, apart from the completion's): the strategies hand an
objective nothing but (output, targets), and every split keeps a row's targets with its output. The NLL is the mean over the global batch's chosen targets (Pairs.chosen_targets, from the data
alone): each micro-batch's share is its sum scaled so the strategies' equal-weight mean over micro-batches and ranks
is that mean, as framework/models/loss.py does for masked targets; on one micro-batch it is TRL's, which takes the
mean over its micro-batch's chosen tokens.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from framework.models.loss import IGNORE_INDEX, token_logps
from framework.objectives.preference import REWARD_METRICS, PreferenceObjective, PreferenceOptions, reward_metrics

#: a prompt target t travels in the targets as PROMPT - t: below IGNORE_INDEX, so apart from every trained one
PROMPT = IGNORE_INDEX - 1
_LN_HALF = -0.6931471805599453


@dataclass
class ORPOOptions(PreferenceOptions):
    name: str = "orpo"
    beta: float = 0.1                       # the odds-ratio term's weight against the NLL (the paper's lambda)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, each branch where it keeps its digits (Maechler 2012, TRL's log1mexp)."""
    return torch.where(x < _LN_HALF, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def with_prompt(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`targets` with the chosen rows' (0, 2, 4, ...) prompts scored too: each position before a row's first
    trained target predicts the next input token, carried as PROMPT - token."""
    trained = targets != IGNORE_INDEX
    first = trained.int().argmax(1)                             # the first trained position (0: none)
    prompt = torch.arange(targets.shape[1], device=targets.device) < first[:, None]
    prompt[1::2] = False
    following = torch.cat([inputs[:, 1:], inputs[:, -1:]], 1)   # the last column is never before a trained one
    return torch.where(prompt, PROMPT - following, targets)


def split_targets(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(every scored target: prompt and completion, the completion's alone) from `with_prompt`'s targets."""
    prompt = targets < IGNORE_INDEX
    return torch.where(prompt, PROMPT - targets, targets), targets.masked_fill(prompt, IGNORE_INDEX)


class ORPO(PreferenceObjective):
    name = "orpo"
    options = ORPOOptions
    metric_names = (*REWARD_METRICS, "nll_loss", "log_odds_ratio", "log_odds_chosen")

    def __init__(self, options=None):
        super().__init__(options)
        self._chosen: tuple[int, int] | None = None     # (chosen targets, pairs) of the global batch being run

    @contextlib.contextmanager
    def chosen_batch(self, targets: int, pairs: int):
        """Within: the NLL is a share of the mean over `targets` chosen targets of a global batch of `pairs`."""
        previous, self._chosen = self._chosen, (targets, pairs)
        try:
            yield
        finally:
            self._chosen = previous

    def global_batch(self, sampler, step: int):
        return self.chosen_batch(sampler.chosen_targets(step), sampler.batch_sizes.size(step))

    def prepare(self, batch: tuple) -> tuple:
        inputs, targets, *rest = batch
        return (inputs, with_prompt(inputs, targets), *rest)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        scored, completion = split_targets(targets)
        token = token_logps(output, scored)             # one pass of the head for both terms
        trained = completion != IGNORE_INDEX
        logps = token.masked_fill(~trained, 0).sum(1).view(-1, 2)
        counts = trained.sum(1).view(-1, 2).to(logps.dtype)
        nll = self._nll(token[0::2].sum(), (scored[0::2] != IGNORE_INDEX).sum(), len(logps))
        per_pair, metrics = self.pair_losses(logps, counts, None)
        if torch.is_grad_enabled():
            metrics["nll_loss"] = nll.detach().expand(len(per_pair))    # its pair-weighted mean is the global one
            self._add(metrics, len(per_pair))
        return nll + per_pair.mean()

    def _nll(self, chosen_logps: torch.Tensor, chosen_targets: torch.Tensor, pairs: int) -> torch.Tensor:
        """The micro-batch's share of the mean NLL over the global batch's chosen targets (outside one: its own)."""
        if self._chosen is None:
            return -chosen_logps / chosen_targets.clamp(min=1)
        targets, global_pairs = self._chosen
        return -chosen_logps * (global_pairs / pairs / max(targets, 1))

    def pair_losses(self, logps, counts, reference):
        beta = self.cfg.beta
        average = (logps / counts.clamp(min=1)).float()
        log_odds = (average[:, 0] - average[:, 1]) - (log1mexp(average[:, 0]) - log1mexp(average[:, 1]))
        ratio = F.logsigmoid(log_odds)
        rewards = beta * average.detach()
        metrics = reward_metrics(rewards[:, 0], rewards[:, 1], average[:, 0], average[:, 1])
        metrics.update(log_odds_ratio=ratio, log_odds_chosen=log_odds)
        return -beta * ratio, metrics
