"""trainer.compile: torch.compile per repeated block, as torchtitan does it, so FSDP units and
activation-checkpointed regions stay whole (FSDP's hooks run around the compiled forward, a
checkpointed block is compiled with its checkpoint). The block's `forward` is replaced on the instance,
so parameter and state-dict names are those of the eager model and checkpoints load either way. A model
whose blocks are unknown has its whole forward compiled. The one entry every torch-native strategy
calls, after activation checkpointing and before FSDP."""
from __future__ import annotations

import logging

import torch
from torch import nn

from framework.models.spec import ModelSpec
from framework.parallel.blocks import find_blocks

log = logging.getLogger(__name__)


def compile_blocks(model: nn.Module, cfg, spec: ModelSpec) -> int:
    """Compile each block's forward in place when trainer.compile; return how many were compiled."""
    if not cfg.trainer.compile:
        return 0
    classes = list(cfg.activation_checkpointing.block_classes) or spec.block_classes(model)
    if not classes:
        model.forward = torch.compile(model.forward)
        return 1
    blocks = find_blocks(model, classes)
    for _, block in blocks:
        block.forward = torch.compile(block.forward)
    return len(blocks)
