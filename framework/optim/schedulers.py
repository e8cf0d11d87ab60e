"""LR schedules as multipliers of optimizer.lr: linear warm-up, then a stable phase and a decay.

Every schedule is warmup-stable-decay (WSD) with its own decay: `cosine` and `linear` decay over the
whole run after the warm-up, `constant` never decays, `wsd` decays over `decay_fraction` of the run.
The multiplier is a function of (step, trainer.max_steps) only, so a run resumed with a larger
max_steps keeps its stable phase and decays at the new end.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

DECAYS = {"linear": lambda p: 1.0 - p,
          "sqrt": lambda p: 1.0 - math.sqrt(p),
          "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p))}
# name -> (decay_fraction, decay_type) of the fixed schedules; wsd reads both from its config
FIXED = {"cosine": (1.0, "cosine"), "linear": (1.0, "linear"), "constant": (0.0, "linear")}
SCHEDULES = (*FIXED, "wsd")


@dataclass(frozen=True)
class Schedule:
    warmup_steps: int
    max_steps: int
    decay_fraction: float
    decay_type: str
    min_lr_ratio: float

    @classmethod
    def from_config(cls, sched_cfg, max_steps: int) -> "Schedule":
        fraction, decay_type = FIXED.get(sched_cfg.name) or (sched_cfg.decay_fraction, sched_cfg.decay_type)
        return cls(sched_cfg.warmup_steps, max_steps, fraction, decay_type, sched_cfg.min_lr_ratio)

    @property
    def decay_steps(self) -> int:
        """A fraction of the whole run (torchtitan's decay_ratio), never into the warm-up."""
        return max(0, min(round(self.decay_fraction * self.max_steps), self.max_steps - self.warmup_steps))

    @property
    def decay_start(self) -> int:
        return self.max_steps - self.decay_steps

    def multiplier(self, step: int) -> float:
        if self.warmup_steps > 0 and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay = self.decay_steps
        if step < self.decay_start or decay == 0:
            return 1.0
        progress = min(1.0, (step - self.decay_start) / decay)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * DECAYS[self.decay_type](progress)


class StepScheduler(LambdaLR):
    """LambdaLR whose saved state is the step (and where its decay began): on load the lr is recomputed from
    THIS run's schedule, so a resumed run follows its own config (a larger trainer.max_steps included), and a
    tensor lr (torchao's optimizers) never reaches the checkpoint's JSON."""

    def __init__(self, optimizer, schedule: Schedule):
        self.schedule = schedule
        super().__init__(optimizer, schedule.multiplier)

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "max_steps": self.schedule.max_steps,
                "decay_start": self.schedule.decay_start}

    def load_state_dict(self, state: dict) -> None:
        # a checkpoint written before this class holds LambdaLR's full state: its last_epoch is the step too
        self.last_epoch = state["last_epoch"]
        self._step_count = self.last_epoch + 1
        self._warn_if_extended_inside_decay(state)
        # LambdaLR's own arithmetic (base_lr * lambda), so the lr equals an uninterrupted run's to the bit
        for group, base, fn in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            lr = base * fn(self.last_epoch)
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _warn_if_extended_inside_decay(self, state: dict) -> None:
        old_max, old_start = state.get("max_steps"), state.get("decay_start")
        if old_max is None or old_max == self.schedule.max_steps or old_start is None or old_start >= old_max:
            return
        if self.last_epoch > old_start and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"warning: trainer.max_steps: the checkpoint (step {self.last_epoch}) is inside the decay that "
                  f"began at step {old_start} of {old_max}; with trainer.max_steps={self.schedule.max_steps} the "
                  f"lr goes back up to {self.schedule.multiplier(self.last_epoch):.3g} x optimizer.lr: to extend "
                  f"a run, resume from a checkpoint at step {old_start} or before", file=sys.stderr, flush=True)


def build_scheduler(optimizer, sched_cfg, max_steps: int) -> StepScheduler:
    return StepScheduler(optimizer, Schedule.from_config(sched_cfg, max_steps))
