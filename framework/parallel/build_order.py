"""The order every strategy builds its model in, said once: activation checkpointing -> compile -> wrap.

Activation checkpointing wraps whole blocks, compile then compiles each block with its checkpoint inside,
and the wrapper (DDP, FSDP2, DeepSpeed's engine) goes around what both left, so its hooks run around the
compiled forward. What must come first (the pipeline split, tensor parallelism) happens before this call;
filling meta parameters comes after.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from torch import nn

from framework.models.spec import ModelSpec
from framework.parallel.activation_checkpointing import checkpoint_activations
from framework.parallel.compile import compile_blocks

Wrapped = TypeVar("Wrapped")


def checkpoint_compile_wrap(model: nn.Module, cfg, spec: ModelSpec, wrap: Callable[[nn.Module], Wrapped]) -> Wrapped:
    """`wrap(model)` after activation_checkpointing.* and trainer.compile have been applied to it."""
    checkpoint_activations(model, cfg.activation_checkpointing, spec)
    compile_blocks(model, cfg, spec)
    return wrap(model)
