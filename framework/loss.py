"""The training loss: next-token cross-entropy in fp32 over (..., vocab) logits. The trainer trains with it
and the planner measures and times with it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
