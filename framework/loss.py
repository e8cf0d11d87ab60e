"""The training loss: next-token cross-entropy in fp32 over (..., vocab) logits. The trainer trains with it
and the planner measures and times with it.

`micro_batch_weight` is the factor a strategy scales one micro-batch's loss by before backward (1/n for
n accumulated micro-batches): a model that adds a loss of its own to the graph (MoE balancing) weights
it alike, so the step's gradient does not depend on how the batch is split."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

_weight = [1.0]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


@contextlib.contextmanager
def weighted_micro_batch(weight: float):
    """Within: backward scales this micro-batch's loss by `weight`."""
    previous, _weight[0] = _weight[0], weight
    try:
        yield
    finally:
        _weight[0] = previous


def micro_batch_weight() -> float:
    return _weight[0]
