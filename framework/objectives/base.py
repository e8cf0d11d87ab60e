"""The interface every objective implements."""
from __future__ import annotations

import abc
from contextlib import AbstractContextManager

import torch

from framework.models.loss import global_batch


class Objective(abc.ABC):
    """Scores one micro-batch: `objective(output, targets)` is the loss a strategy backpropagates (a share of the
    global batch's mean, framework/models/loss.py says how)."""

    name: str = ""

    @abc.abstractmethod
    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss: a scalar tensor, a share of the mean over the global batch."""

    def __call__(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(output, targets)

    def global_batch(self, trained: int | None, sequences: int, width: int | None) -> AbstractContextManager:
        """While inside, losses are shares of the mean over the `trained` targets of a global batch of
        `sequences` rows of `width` positions (framework.models.loss.global_batch)."""
        return global_batch(trained, sequences, width)
