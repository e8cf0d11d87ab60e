"""Pipeline parallelism with torch.distributed.pipelining: which stages a rank holds, the schedule,
and the rules a schedule puts on stages and micro-batches (checked before any worker starts).

A model is cut into pp x pp_virtual_stages stages. Single-stage schedules (GPipe, 1F1B) give each
rank one; looped schedules give rank r the stages r, r + pp, ...; V-shaped ones (ZBVZeroBubble,
DualPipeV) give rank r the stages r and 2pp - 1 - r, so rank 0 holds both the first and the last.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from framework.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup

# The rules are kept by name, so that validation and the planner need no torch.distributed.pipelining
# (it imports dynamo: ~0.8 s a launch); tests/integration/strategies/test_parallel3d_validation.py holds them to
# torch's classes.
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE = ("GPipe", "1F1B")                 # subclasses of PipelineScheduleSingle: one stage per rank
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
#: schedules that split each backward in two, the inputs' gradients then the weights': a block's backward graph
#: is run twice (a checkpointed block recomputed twice)
SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
#: schedules that run out of work to overlap (and refuse to start) with fewer micro-batches than ranks
NEED_MICROBATCHES_PER_RANK = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def canonical_name(name: str) -> str:
    """Schedule names are case-insensitive, as in torch."""
    names = {s.lower(): s for s in SCHEDULES}
    if name.lower() not in names:
        raise ConfigError("parallel.pp_schedule", f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}")
    return names[name.lower()]


def schedule_class(name: str) -> type:
    from torch.distributed.pipelining.schedules import get_schedule_class
    return get_schedule_class(canonical_name(name))


def stage_ids(pp_rank: int, pp: int, virtual: int, schedule: str) -> list[int]:
    """The stages pipeline rank `pp_rank` holds under the schedule named `schedule`."""
    if canonical_name(schedule) in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(virtual)]


def min_microbatches(name: str, pp: int, virtual: int) -> int:
    name = canonical_name(name)
    if name == "DualPipeV":
        return pp * virtual
    return pp if name in NEED_MICROBATCHES_PER_RANK else 1


def validate_pipeline(name: str, pp: int, virtual: int, n_layers: int, microbatches: int) -> None:
    """Schedule, stage and micro-batch rules, with the numbers."""
    known = canonical_name(name)
    single, v_shaped = known in SINGLE_STAGE, known in V_SHAPED
    if virtual < 1:
        raise ConfigError("parallel.pp_virtual_stages", f"must be at least 1, got {virtual}")
    if single and virtual != 1:
        raise ConfigError("parallel.pp_virtual_stages", f"parallel.pp_schedule={name} runs one stage per rank, got "
                                                        f"{virtual}; use Interleaved1F1B, LoopedBFS or "
                                                        f"InterleavedZeroBubble for virtual stages")
    if v_shaped and virtual != 2:
        raise ConfigError("parallel.pp_virtual_stages", f"parallel.pp_schedule={name} places exactly 2 stages per rank "
                                                        f"(V shape), got {virtual}")
    stages = pp * virtual
    if n_layers % stages:
        raise ConfigError("model.n_layers", f"{n_layers} layers do not divide into pp x pp_virtual_stages = "
                                            f"{pp} x {virtual} = {stages} equal stages")
    need = min_microbatches(name, pp, virtual)
    if microbatches < need:
        raise ConfigError("parallel.pp_microbatches", f"parallel.pp_schedule={name} needs at least {need} micro-batches "
                                                      f"with parallel.pp={pp}, got {microbatches}")
    if not single:
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            raise ConfigError("parallel.pp_microbatches", f"parallel.pp_schedule={name} runs micro-batches in rounds of "
                                                          f"parallel.pp={pp}: {microbatches} is not a multiple of "
                                                          f"{rounds} rounds; use a multiple of {pp}")


@functools.cache
def _stage_class() -> type:
    """torch's PipelineStage, its shape-inference forward marked as one (models count nothing of it)."""
    from torch.distributed.pipelining import PipelineStage

    from framework.models.shape_inference import inferring_shapes

    class Stage(PipelineStage):
        def _forward_metadata_inference(self, *args, **kwargs):
            with inferring_shapes():
                return super()._forward_metadata_inference(*args, **kwargs)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            # A split backward (SPLIT_BACKWARD) names the weights it will differentiate by the module's
            # parameters when it starts, before autograd's pre-backward hooks run. FSDP2 units resharded
            # after forward (zero=stage3) then show their sharded parameters, which the graph never used:
            # their weight gradients were silently never computed. Gathered first, they are the ones the
            # forward used, for the inputs' half and, after a later micro-batch's forward resharded them
            # again, for the weights' half.
            if backward_type != "full":
                _unshard_fsdp(self.submod)
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward=last_backward)
    return Stage


def _unshard_fsdp(module: nn.Module) -> None:
    """All-gather every FSDP2 unit's parameters in `module` (a no-op for units already gathered)."""
    from torch.distributed.fsdp import FSDPModule
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.unshard()


def _documents_along(module: nn.Module, last: bool) -> nn.Module:
    """The stage module taking (activations, packed documents' numbers), which every stage but the last hands
    on beside its output, so each stage's attention keeps to the documents."""
    from torch import nn

    class DocumentsAlong(nn.Module):
        def __init__(self):
            super().__init__()
            self.stage = module

        def forward(self, x, documents):
            out = self.stage(x, documents)
            return out if last else (out, documents)
    return DocumentsAlong()


def build_schedule(name: str, modules: list[nn.Module], ids: list[int], num_stages: int, microbatches: int,
                   loss_fn: Callable, group: ProcessGroup, device: torch.device, documents: bool = False):
    """PipelineStages for this rank's stage modules and the schedule that drives them; with `documents` the
    first stage takes (tokens, documents) and each stage passes the documents on.

    Loss is the per-micro-batch mean; the schedule scales gradients by 1/microbatches so they are
    those of the mean over the rank's whole batch."""
    if documents:
        modules = [_documents_along(m, i == num_stages - 1) for m, i in zip(modules, ids)]
    stages = [_stage_class()(m, i, num_stages, device, group=group) for m, i in zip(modules, ids)]
    cls = schedule_class(name)
    if canonical_name(name) in SINGLE_STAGE:
        return cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
