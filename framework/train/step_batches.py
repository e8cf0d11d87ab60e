"""A training step's forward and backward over its global batch: how many sequences the step takes (the
final global batch size, or during trainer.rampup_batch_size its ramp size: framework/data/ramp.py), how a
rank's share of them splits into micro-batches, and trainer.on_oom=retry.

On an out-of-memory error inside a step every rank agrees (a one-flag all-reduce among the hosts after each
step's forward and backward), forgets the step's gradients, frees cached memory, halves its micro-batches
(BatchLayout.halved) and runs the step again: the global batch stays, split into more micro-batches, so the
loss curve is the one the smaller micro-batch gives. At one sequence a micro-batch it stops, naming the memory
it lacked. The retry is exact where every rank met the error at the same point of the step (identical ranks
run identical shapes) or after the step's collectives; a rank left waiting inside a collective for a peer that
failed before it stops at launcher.timeout_s instead.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import TYPE_CHECKING

import torch

from framework.data.batches import micro_batches
from framework.data.ramp import BatchSizes
from framework.objectives.base import Objective
from framework.runtime import faults

if TYPE_CHECKING:
    from framework.config.schema import Config


class OutOfMemoryAtOneSequence(RuntimeError):
    """trainer.on_oom=retry got down to micro-batches of one sequence and still ran out of memory."""


def lacked(message: str) -> str:
    """What an out-of-memory message says was missing: CUDA's 'Tried to allocate X ... of which Y is free'."""
    asked = re.search(r"Tried to allocate ([\d.]+ ?[KMGT]?i?B)", message)
    free = re.search(r"of which ([\d.]+ ?[KMGT]?i?B) is free", message)
    if not asked:
        return message.strip().splitlines()[0][:200] if message.strip() else "no detail"
    return f"it tried to allocate {asked.group(1)}" + (f" with {free.group(1)} free" if free else "")


class StepBatches:
    def __init__(self, cfg: Config, strategy, objective: Objective):
        t = cfg.trainer
        self.strategy = strategy
        self.objective = objective
        self.sizes = BatchSizes(t.global_batch_size, t.rampup_batch_size)
        self.layout = strategy.batch_layout(cfg, strategy.world_size)     # at the final global batch size
        self.retry = t.on_oom == "retry"
        self._planned = None
        self.reference = None       # a ReferencePass, once the strategy has its model (Trainer.fit)
        # rows of one example each (data.packing=false) padded to one width under compile: one shape, one graph
        self.width = cfg.data.seq_len + 1 if t.compile else None
        self._batch = None          # (sampler, step) of the global batch being run

    @contextlib.contextmanager
    def global_batch(self, sampler, step: int):
        """Within, losses are shares of the mean over the targets step `step`'s global batch trains (and the
        micro-batches cut are of that batch: the precomputed reference looks its pairs up by id)."""
        self._batch = (sampler, step)
        try:
            with self.objective.global_batch(sampler, step):
                yield
        finally:
            self._batch = None

    def _local_ids(self):
        """(sampler, this rank's share of the ids of the global batch being run), or (None, None) outside one."""
        if self._batch is None:
            return None, None
        sampler, step = self._batch
        ids = sampler.sequence_ids(step)
        share = len(ids) // self.strategy.dp_size
        return sampler, ids[self.strategy.dp_rank * share:(self.strategy.dp_rank + 1) * share]

    def layout_of(self, step: int):
        """The batch layout of training step `step` (1-based)."""
        return self.layout.with_global(self.sizes.size(step - 1))

    def micro_batches(self, local, layout) -> list:
        """A rank's share as micro-batches of `layout` (counted in the sampler's examples: a preference pair is
        two rows), with the reference's log-probs queued where the objective reads them."""
        found = [] if local is None else micro_batches(local, layout.micro_batch * self.objective.rows_per_example,
                                                        self.width)
        found = [self.objective.prepare(batch) for batch in found]
        self.objective.begin_step()
        if self.reference is not None:
            self.reference.run(found, *(self._local_ids() if self.reference.precomputed else ()))
        return found

    def record(self, step: int) -> dict:
        """The step's batch sizes, and the objective's own metrics (its sums reduced over ranks, divided once)."""
        out = {"global_batch_size": self.sizes.size(step - 1), "micro_batch_size": self.layout.forward_batch}
        names = self.objective.metric_names
        if names:
            sums = self.objective.metric_sums()
            sums = self.strategy.reduce_mean(torch.zeros(len(names) + 1, dtype=torch.float64,
                                                         device=self.strategy.device) if sums is None else sums)
            out.update(zip(names, (sums[:-1] / sums[-1].clamp(min=1)).tolist()))
        return out

    def plan(self, layout) -> None:
        """Let the strategy make ready for batches of this layout, where it differs from the last one's."""
        if layout != self._planned:
            self.strategy.plan_batches(layout)
            self._planned = layout

    def forward_backward(self, step: int, local: torch.Tensor | None) -> torch.Tensor:
        """The step's forward and backward over this rank's share `local` (None: a rank that takes no batch)."""
        s = self.strategy
        while True:
            layout = self.layout_of(step)
            self.plan(layout)
            failed = None
            try:
                loss = s.forward_backward(self.micro_batches(local, layout), self.objective)
                faults.inject("oom", step, micro=layout.forward_batch)
            except torch.OutOfMemoryError as e:
                if not self.retry:
                    raise
                failed = f"rank {s.rank}: {lacked(str(e))}"
            if not self.retry or (failed := s.first_report(failed)) is None:
                return loss
            loss = None
            s.drop_step()
            smaller = self.layout.halved()
            if smaller is None:
                raise OutOfMemoryAtOneSequence(f"trainer.on_oom: out of memory at micro-batch 1 in step {step} "
                                               f"({failed}); make the model take less memory per GPU: "
                                               f"activation_checkpointing=full, zero=stage3, parallel.tp or parallel.pp")
            if s.is_main:
                print(f"warning: trainer.on_oom=retry: out of memory in step {step} at micro-batch "
                      f"{layout.forward_batch} ({failed}); running it again at micro-batch {smaller.forward_batch} "
                      f"(trainer.micro_batch_size={smaller.forward_batch} starts there)", file=sys.stderr, flush=True)
            self.layout = smaller
