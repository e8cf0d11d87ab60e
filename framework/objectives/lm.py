"""`lm`: language modelling, next-token cross-entropy in fp32 over the vocabulary (framework/models/loss.py)."""
from __future__ import annotations

import torch

from framework.models.loss import cross_entropy
from framework.objectives.base import Objective


class NextTokenCrossEntropy(Objective):
    name = "lm"

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(output, targets)
