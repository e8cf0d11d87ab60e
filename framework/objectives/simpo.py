"""`objective=simpo`: SimPO (Meng et al. 2024), reference-free: the completions' log-probs averaged over their
tokens, a target margin gamma. As TRL 1.16's experimental CPOTrainer computes it with loss_type="simpo" and
cpo_alpha=0 (trl/experimental/cpo/cpo_trainer.py :715-727, its metrics :894-912): with a = avg log pi(chosen) -
avg log pi(rejected), the loss is -(1 - e) log sigmoid(beta a - gamma) - e log sigmoid(-(beta a - gamma)) (TRL's
`simpo_gamma` is gamma itself: it subtracts gamma / beta inside beta's product). Rewards: beta times each average;
logps/*: the averages.
"""
from __future__ import annotations

from dataclasses import dataclass

from framework.objectives.dpo import conservative_sigmoid
from framework.objectives.preference import PreferenceObjective, PreferenceOptions, reward_metrics


@dataclass
class SimPOOptions(PreferenceOptions):
    name: str = "simpo"
    beta: float = 2.0                       # the reward scale
    gamma: float = 0.5                      # the target reward margin (TRL's simpo_gamma)
    label_smoothing: float = 0.0            # the chance a pair's labels are flipped (conservative form); 0 = SimPO


class SimPO(PreferenceObjective):
    name = "simpo"
    options = SimPOOptions

    def pair_losses(self, logps, counts, reference):
        beta = self.cfg.beta
        average = logps / counts.clamp(min=1)
        per_pair = conservative_sigmoid(beta * (average[:, 0] - average[:, 1]) - self.cfg.gamma,
                                        self.cfg.label_smoothing)
        rewards = beta * average.detach()
        return per_pair, reward_metrics(rewards[:, 0], rewards[:, 1], average[:, 0], average[:, 1])
