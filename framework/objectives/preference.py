"""What the preference objectives (dpo, simpo, orpo) share: a micro-batch's rows are pairs, chosen then rejected
(c0, r0, c1, r1, ...: framework/data/examples.py `Pairs`), so every even split -- micro-batches, data-parallel
ranks -- keeps a pair whole; the targets are trained (not IGNORE_INDEX) on the completion's tokens only, so a
row's summed log-prob is the completion's log-prob given the prompt, as TRL's DPOTrainer computes it.

Each micro-batch's loss is the mean over its pairs. Every micro-batch of a step holds equally many pairs, so the
strategies' equal-weight mean over micro-batches and ranks is the mean over the global batch's pairs, whatever the
layout: no token scaling (framework/models/loss.py's global_batch) applies. The metrics (TRL's names) are summed
over pairs here and divided once, after the trainer reduces the sums over ranks.

The reference model's per-row log-probs come from a pass without gradient over the same micro-batches just
before the step's (framework/train/reference.py): `reference_fn` lists them in micro-batch order and `loss`
reads them in the same order, on the same thread (the pattern of framework/models/loss.py's deferred head),
starting over after the last: a pass of the step's micro-batches before the training one (a model's batch
statistics, MoE's) reads the same values again. Only the passes with gradient add to the metrics.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from framework.models.loss import IGNORE_INDEX, token_logps
from framework.objectives.base import Objective, ObjectiveOptions

#: TRL's metric names, as DPOTrainer logs them
REWARD_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                  "logps/chosen", "logps/rejected")


@dataclass
class PreferenceOptions(ObjectiveOptions):
    beta: float = 0.1                       # how far from the reference (dpo) / the reward scale (simpo, orpo)
    #: score every pair with the reference once, before training, and keep the log-probs with the checkpoints
    #: (framework/train/reference_table.py) instead of holding the reference through training
    precompute_reference: bool = False


def pair_logps(output: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed completion log-probs, completion token counts), each [pairs, 2]: column 0 chosen, 1 rejected."""
    sums = token_logps(output, targets).sum(1)
    counts = (targets != IGNORE_INDEX).sum(1).to(sums.dtype)
    return sums.view(-1, 2), counts.view(-1, 2)


class PreferenceObjective(Objective):
    rows_per_example = 2
    metric_names = REWARD_METRICS

    def __init__(self, options=None):
        super().__init__(options)
        self.reference: list[torch.Tensor] = []
        self._read = 0
        self._sums: torch.Tensor | None = None

    def begin_step(self) -> None:
        self._sums = None

    def forget_reference(self) -> None:
        self.reference.clear()
        self._read = 0

    def _next_reference(self) -> torch.Tensor:
        found = self.reference[self._read]
        self._read = (self._read + 1) % len(self.reference)
        return found

    def reference_fn(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The reference pass's loss_fn: lists the micro-batch's [pairs, 2] log-probs, returns 0."""
        logps, _ = pair_logps(output, targets)
        self.reference.append(logps.detach())
        return logps.new_zeros(())

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logps, counts = pair_logps(output, targets)
        reference = self._next_reference() if self.needs_reference else None
        per_pair, metrics = self.pair_losses(logps, counts, reference)
        if torch.is_grad_enabled():
            self._add(metrics, len(per_pair))
        return per_pair.mean()

    @abc.abstractmethod
    def pair_losses(self, logps: torch.Tensor, counts: torch.Tensor, reference: torch.Tensor | None):
        """(the loss of each pair [pairs], {metric: per-pair values} for `metric_names`) from the policy's and the
        reference's (None: reference-free) [pairs, 2] log-probs and the completions' token counts."""

    def _add(self, metrics: dict[str, torch.Tensor], pairs: int) -> None:
        found = torch.stack([metrics[k].detach().double().sum() for k in self.metric_names])
        found = torch.cat([found, found.new_tensor([pairs])])
        self._sums = found if self._sums is None else self._sums + found

    def metric_sums(self) -> torch.Tensor | None:
        return self._sums


def reward_metrics(chosen: torch.Tensor, rejected: torch.Tensor, logps_chosen: torch.Tensor,
                   logps_rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's six, per pair: the rewards, whether chosen's is the higher (strictly, as TRL), their margin, and the
    policy's log-probs of each completion."""
    return {"rewards/chosen": chosen, "rewards/rejected": rejected,
            "rewards/accuracies": (chosen > rejected).to(chosen.dtype), "rewards/margins": chosen - rejected,
            "logps/chosen": logps_chosen, "logps/rejected": logps_rejected}
