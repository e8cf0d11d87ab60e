"""Activation checkpointing of a model's blocks with torch.utils.checkpoint.

`full` recomputes every block in backward; `layer` every Nth block (every_n_layers), optionally
saving matmul outputs inside the recomputed blocks (save_matmuls) so only cheap ops are redone; `op`
checkpoints every block under torch's selective-checkpoint policy: the outputs of matmuls and of
attention are kept, everything else (norms, activations, rotary, residual adds) is recomputed.
save_every_nth_matmul=2 keeps only every other matmul's output (torchtitan's op-level policy): less
memory for a second forward of half the matmuls.

The recompute inside backward runs under the torch-function modes the forward ran under (context
parallelism's attention is one): torch's checkpoint re-enters only a device context itself, and a
recompute that took another path would save other tensors than the forward did.

The block's own `forward` is replaced on the instance instead of wrapping the block in another
module, so parameter and state-dict names stay exactly those of the plain model (checkpoints load
either way). Apply before FSDP: its hooks run around the module call, the recomputation inside it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from framework.errors import ConfigError
from framework.models.spec import ModelSpec, spec_for
from framework.parallel.blocks import find_blocks

MODES = ("none", "full", "layer", "op")

_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.linear.default}
# Every backend scaled_dot_product_attention may dispatch to (what the dispatcher sees is the backend op).
_ATTENTION = {getattr(torch.ops.aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_attention_math") if hasattr(torch.ops.aten, name)}


def _keep_matmuls(every: int, attention: bool):
    """A policy for one checkpointed call: keep the 1st, (1+every)th, ... matmul output of the block (every=2
    is torchtitan's op-level policy, which recomputes every second matmul) and, with `attention`, attention's
    outputs; recompute the rest. The recompute counts its own matmuls, so both passes pick the same ones."""
    seen = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in _MATMULS:
            seen[ctx.is_recompute] += 1
            keep = (seen[ctx.is_recompute] - 1) % every == 0
        else:
            keep = attention and op in _ATTENTION
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _forward_function_modes() -> list:
    """The torch-function modes active now, but torch's own device context (checkpoint re-enters that one)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    return [m for m in _get_current_function_mode_stack() if not isinstance(m, DeviceContext)]


class _Within:
    """`context` with the forward's torch-function modes entered too: a new stack each time it is entered, since a
    split backward (a zero-bubble pipeline's inputs, then weights) recomputes a block twice."""

    def __init__(self, context, modes: list):
        self.context, self.modes = context, modes

    def __enter__(self):
        self.stack = contextlib.ExitStack()
        self.stack.enter_context(self.context)
        for mode in self.modes:
            self.stack.enter_context(mode)

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


def _checkpointed_forward(forward, make_policy):
    def contexts(modes):
        forward_ctx, recompute_ctx = (create_selective_checkpoint_contexts(make_policy()) if make_policy
                                      else (contextlib.nullcontext(), contextlib.nullcontext()))
        if not modes:       # what torch.compile requires: the two dispatch modes themselves
            return forward_ctx, recompute_ctx
        return forward_ctx, _Within(recompute_ctx, modes)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        modes = _forward_function_modes()
        extra = {"context_fn": functools.partial(contexts, modes)} if make_policy or modes else {}
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)
    return run


def check_mode(ac) -> None:
    if ac.mode == "selective":     # the name `layer` had before `op` existed
        raise ConfigError("activation_checkpointing.mode", "'selective' is now 'layer' (every_n_layers blocks; what "
                                                           "activation_checkpointing=selective sets) or 'op' (keep "
                                                           "matmul and attention outputs in every block)")
    if ac.mode not in MODES:
        raise ConfigError("activation_checkpointing.mode", f"unknown mode {ac.mode!r}; use {', '.join(MODES)}")


def validate_activation_checkpointing(cfg) -> None:
    ac = cfg.activation_checkpointing
    check_mode(ac)
    if ac.mode == "none":
        return
    if ac.mode == "layer" and ac.every_n_layers < 1:
        raise ConfigError("activation_checkpointing.every_n_layers", f"must be at least 1, got {ac.every_n_layers}")
    if ac.save_matmuls and ac.mode != "layer":
        raise ConfigError("activation_checkpointing.save_matmuls",
                          "applies to activation_checkpointing.mode=layer (mode=op always keeps matmul outputs)")
    if ac.save_every_nth_matmul < 1:
        raise ConfigError("activation_checkpointing.save_every_nth_matmul",
                          f"must be at least 1, got {ac.save_every_nth_matmul}")
    if ac.save_every_nth_matmul > 1 and not (ac.mode == "op" or ac.save_matmuls):
        raise ConfigError("activation_checkpointing.save_every_nth_matmul",
                          "applies where matmul outputs are kept: activation_checkpointing.mode=op, or mode=layer "
                          "with save_matmuls=true")
    if not ac.block_classes and not spec_for(cfg.model).has_blocks(cfg.model):
        raise ConfigError("activation_checkpointing.block_classes",
                          f"{cfg.model._target_} has no block_classes(); name the classes to checkpoint")


def selected_blocks(model: nn.Module, ac_cfg, block_classes: Iterable[str | type] = ()) -> list[str]:
    if ac_cfg.mode == "none":
        return []
    blocks = find_blocks(model, block_classes)
    every = ac_cfg.every_n_layers if ac_cfg.mode == "layer" else 1
    return [name for i, (name, _) in enumerate(blocks) if (i + 1) % every == 0]


def apply_activation_checkpointing(model: nn.Module, ac_cfg, block_classes: Iterable[str | type] = ()) -> list[str]:
    """Checkpoint the blocks `ac_cfg` selects; return their qualified names."""
    if ac_cfg.mode not in MODES:
        raise ValueError(f"unknown activation checkpointing mode {ac_cfg.mode!r}; use {', '.join(MODES)}")
    names = selected_blocks(model, ac_cfg, block_classes)
    policy = None
    if ac_cfg.mode == "op" or (ac_cfg.mode == "layer" and ac_cfg.save_matmuls):
        policy = functools.partial(_keep_matmuls, ac_cfg.save_every_nth_matmul, ac_cfg.mode == "op")
    for name in names:
        block = model.get_submodule(name)
        block.forward = _checkpointed_forward(block.forward, policy)
    return names


def checkpoint_activations(model: nn.Module, ac_cfg, spec: ModelSpec) -> list[str]:
    """The one entry every strategy calls: the blocks activation_checkpointing.block_classes names,
    else the model spec's blocks."""
    if ac_cfg.mode == "none":
        return []
    return apply_activation_checkpointing(model, ac_cfg, list(ac_cfg.block_classes) or spec.block_classes(model))
