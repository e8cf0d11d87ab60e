"""Activation checkpointing of a model's blocks with torch.utils.checkpoint.

`full` recomputes every block in backward, `selective` every Nth block (every_n_layers), optionally
saving matmul outputs inside the recomputed blocks (save_matmuls) so only cheap ops are redone.

The block's own `forward` is replaced on the instance instead of wrapping the block in another
module, so parameter and state-dict names stay exactly those of the plain model (checkpoints load
either way). Apply before FSDP: its hooks run around the module call, the recomputation inside it.
"""
from __future__ import annotations

import functools
from typing import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from framework.errors import ConfigError
from framework.models.spec import ModelSpec, spec_for
from framework.parallel.blocks import find_blocks

MODES = ("none", "full", "selective")

_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.linear.default}


def _save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed_forward(forward, save_matmuls: bool):
    context_fn = (functools.partial(create_selective_checkpoint_contexts, _save_matmuls) if save_matmuls
                  else None)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        extra = {"context_fn": context_fn} if context_fn else {}
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    return run


def validate_activation_checkpointing(cfg) -> None:
    ac = cfg.activation_checkpointing
    if ac.mode == "none":
        return
    if ac.mode == "selective" and ac.every_n_layers < 1:
        raise ConfigError("activation_checkpointing.every_n_layers", f"must be at least 1, got {ac.every_n_layers}")
    if ac.save_matmuls and ac.mode != "selective":
        raise ConfigError("activation_checkpointing.save_matmuls", "applies to activation_checkpointing=selective")
    if not ac.block_classes and not spec_for(cfg.model).has_blocks(cfg.model):
        raise ConfigError("activation_checkpointing.block_classes",
                          f"{cfg.model._target_} has no block_classes(); name the classes to checkpoint")


def selected_blocks(model: nn.Module, ac_cfg, block_classes: Iterable[str | type] = ()) -> list[str]:
    if ac_cfg.mode == "none":
        return []
    blocks = find_blocks(model, block_classes)
    every = 1 if ac_cfg.mode == "full" else ac_cfg.every_n_layers
    return [name for i, (name, _) in enumerate(blocks) if (i + 1) % every == 0]


def apply_activation_checkpointing(model: nn.Module, ac_cfg, block_classes: Iterable[str | type] = ()) -> list[str]:
    """Checkpoint the blocks `ac_cfg` selects; return their qualified names."""
    if ac_cfg.mode not in MODES:
        raise ValueError(f"unknown activation checkpointing mode {ac_cfg.mode!r}; use {', '.join(MODES)}")
    names = selected_blocks(model, ac_cfg, block_classes)
    save_matmuls = ac_cfg.mode == "selective" and ac_cfg.save_matmuls
    for name in names:
        block = model.get_submodule(name)
        block.forward = _checkpointed_forward(block.forward, save_matmuls)
    return names


def checkpoint_activations(model: nn.Module, ac_cfg, spec: ModelSpec) -> list[str]:
    """The one entry every strategy calls: the blocks activation_checkpointing.block_classes names,
    else the model spec's blocks."""
    if ac_cfg.mode == "none":
        return []
    return apply_activation_checkpointing(model, ac_cfg, list(ac_cfg.block_classes) or spec.block_classes(model))
