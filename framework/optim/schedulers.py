"""LR schedules as multipliers of optimizer.lr: linear warm-up, then cosine decay or constant."""
from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR


def lr_multiplier(step: int, name: str, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if name == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


SCHEDULES = ("cosine", "constant")


def build_scheduler(optimizer, sched_cfg, max_steps: int) -> LambdaLR:
    args = (sched_cfg.name, sched_cfg.warmup_steps, max_steps, sched_cfg.min_lr_ratio)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, *args))
