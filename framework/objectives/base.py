"""The interface every objective implements."""
from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from framework.models.loss import global_batch


@dataclass
class ObjectiveOptions:
    name: str = "lm"                        # the objective; set by the group option (objective=<name>)


class Objective(abc.ABC):
    """Scores one micro-batch: `objective(output, targets)` is the loss a strategy backpropagates (a share of the
    global batch's mean, framework/models/loss.py says how)."""

    name: str = ""
    #: the schema dataclass of its `objective.*` keys (conf/objective/<name>.yaml names it)
    options: type = ObjectiveOptions
    #: rows of a micro-batch one example of the sampler's is (2: a preference pair, chosen then rejected)
    rows_per_example: int = 1
    #: whether its loss reads a reference model's log-probs (framework/train/reference.py provides them)
    needs_reference: bool = False

    def __init__(self, options=None):
        self.cfg = options

    @abc.abstractmethod
    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The micro-batch's loss: a scalar tensor, a share of the mean over the global batch."""

    def __call__(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(output, targets)

    def global_batch(self, sampler, step: int) -> AbstractContextManager:
        """While inside, losses are shares of the mean over the trained targets of `sampler`'s global batch of step
        `step` (framework.models.loss.global_batch): what the data alone knows, so every layout gives one number."""
        return global_batch(sampler.trained_tokens(step), sampler.batch_sizes.size(step), sampler.width)

    def prepare(self, batch: tuple) -> tuple:
        """A micro-batch (inputs, targets[, documents]) as the strategies run it, and `loss` gets its targets:
        as the data gives it, unless the objective scores more than the trained targets (orpo)."""
        return batch

    def begin_step(self) -> None:
        """Before a step's (or an evaluation's) micro-batches: forget what the last one left."""

    def metric_sums(self) -> torch.Tensor | None:
        """Sums over this rank's examples since begin_step of the metrics `metric_names` lists, then the count
        they are divided by (reduced over ranks by the trainer); None: no metrics of its own."""
        return None

    metric_names: tuple[str, ...] = ()
