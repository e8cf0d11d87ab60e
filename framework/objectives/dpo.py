"""`objective=dpo`: Direct Preference Optimization (Rafailov et al. 2023) against a reference model, as TRL 1.16's
DPOTrainer computes it (trl/trainer/dpo_trainer.py `_compute_loss`, :1386-1404; its metrics :1580-1601).

With h = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)), the completions' summed
log-probs:
  sigmoid  -log sigmoid(beta h)                      (DPO; label_smoothing e: the conservative form, cDPO,
           -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h), which TRL's CPO trainer computes and TRL 1.16's
           DPOTrainer ignores for sigmoid: it reads label_smoothing only for robust, exo_pair, aot and bco_pair)
  hinge    relu(1 - beta h)                          (SLiC)
  ipo      (h' - 1 / (2 beta))^2, h' the same difference of log-ratios each divided by its completion's token
           count (IPO, Azar et al. 2023, as TRL normalises it)
Rewards: beta times each completion's log-ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from framework.objectives.preference import PreferenceObjective, PreferenceOptions, reward_metrics

LOSS_TYPES = ("sigmoid", "ipo", "hinge")


@dataclass
class DPOOptions(PreferenceOptions):
    name: str = "dpo"
    beta: float = 0.1                       # the KL penalty's weight: how far the policy may move from the reference
    loss_type: Annotated[str, Literal[LOSS_TYPES]] = "sigmoid"   # sigmoid (DPO) | ipo | hinge
    label_smoothing: float = 0.0            # sigmoid: the chance a pair's labels are flipped (cDPO); 0 = DPO


def conservative_sigmoid(z: torch.Tensor, smoothing: float) -> torch.Tensor:
    """-(1 - e) log sigmoid(z) - e log sigmoid(-z): the logistic loss with labels flipped at rate e."""
    return -(1 - smoothing) * F.logsigmoid(z) - smoothing * F.logsigmoid(-z)


class DPO(PreferenceObjective):
    name = "dpo"
    options = DPOOptions
    needs_reference = True

    def pair_losses(self, logps, counts, reference):
        beta = self.cfg.beta
        ratios = logps - reference                  # [pairs, 2]: log pi - log ref of chosen, rejected
        if self.cfg.loss_type == "ipo":
            per_token = ratios / counts.clamp(min=1)
            per_pair = (per_token[:, 0] - per_token[:, 1] - 1 / (2 * beta)) ** 2
        elif self.cfg.loss_type == "hinge":
            per_pair = torch.relu(1 - beta * (ratios[:, 0] - ratios[:, 1]))
        else:
            per_pair = conservative_sigmoid(beta * (ratios[:, 0] - ratios[:, 1]), self.cfg.label_smoothing)
        rewards = beta * ratios.detach()
        return per_pair, reward_metrics(rewards[:, 0], rewards[:, 1], logps[:, 0], logps[:, 1])
