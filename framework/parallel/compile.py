"""trainer.compile: torch.compile per repeated block, as torchtitan does it, so FSDP units and
activation-checkpointed regions stay whole (FSDP's hooks run around the compiled forward, a
checkpointed block is compiled with its checkpoint). The block's `forward` is replaced on the instance,
so parameter and state-dict names are those of the eager model and checkpoints load either way. A model
whose blocks are unknown has its whole forward compiled. The one entry every torch-native strategy
calls, after tensor parallelism and activation checkpointing, before FSDP.

A compiled region's tensor inputs are waited on first. Under tensor parallelism a collective that a
parallel style issues with `async_op=True` (RowwiseParallel's output, e.g. the sharded embedding that
feeds the first block) returns an AsyncCollectiveTensor: a tensor subclass that waits on its first use.
Handed to a compiled graph as an input, AOTAutograd flattens that subclass, and in backward the input's
gradient reaches DTensor's Redistribute node as a plain tensor instead of through `to_local`'s backward
(which would wrap it back into a DTensor): "'Tensor' object has no attribute '_local_tensor'". Waiting
in eager with `wait_tensor` (differentiable, identity backward) gives the graph a plain tensor and costs
nothing: the block's first op would wait there anyway.
"""
from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from framework.models.spec import ModelSpec
from framework.parallel.blocks import find_blocks
from framework.parallel.pipeline import SPLIT_BACKWARD, canonical_name

log = logging.getLogger(__name__)

#: trainer.compile_backend: torch.compile backends (inductor generates kernels; the others only trace)
BACKENDS = ("inductor", "aot_eager", "eager")


def worker_modules(trainer_cfg) -> tuple[str, ...]:
    """What a block's first compile imports besides dynamo: its backends' common module, the pattern matcher
    AOTAutograd's graph clean-up uses (~0.8 s of CPU; not under the eager backend, which stops at dynamo's
    graph), and inductor's compiler where it generates kernels."""
    if not trainer_cfg.compile:
        return ()
    backend = trainer_cfg.compile_backend
    return ("torch._dynamo.backends.common", *(("torch._inductor.pattern_matcher",) if backend != "eager" else ()),
            *(("torch._inductor.compile_fx",) if backend == "inductor" else ()))


def _compiled(forward, backend: str):
    """torch.compile(forward), called with every pending collective in its inputs waited on."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor, wait_tensor   # in the worker only
    from torch.utils._pytree import tree_map_only
    compiled = torch.compile(forward, backend=backend)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        args, kwargs = tree_map_only(AsyncCollectiveTensor, wait_tensor, (args, kwargs))
        return compiled(*args, **kwargs)
    return run


def compile_blocks(model: nn.Module, cfg, spec: ModelSpec) -> int:
    """Compile each block's forward in place when trainer.compile; return how many were compiled."""
    if not cfg.trainer.compile:
        return 0
    classes = list(cfg.activation_checkpointing.block_classes) or spec.block_classes(model)
    backend = cfg.trainer.compile_backend
    if cfg.parallel.get("pp", 1) > 1 and canonical_name(cfg.parallel.pp_schedule) in SPLIT_BACKWARD:
        # the schedule runs a block's backward graph in two calls (inputs' gradients, then weights'), the first
        # keeping the graph; AOTAutograd's donated buffers allow one call (as torchtitan sets for these schedules)
        torch._functorch.config.donated_buffer = False
    if not classes:
        model.forward = _compiled(model.forward, backend)
        return 1
    blocks = find_blocks(model, classes)
    for _, block in blocks:
        block.forward = _compiled(block.forward, backend)
    return len(blocks)
