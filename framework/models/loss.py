"""The training loss: next-token cross-entropy in fp32 over (..., vocab) logits, the mean over the targets
that are not ignore_index (-100). The trainer trains with it and the planner measures and times with it.

Masked targets (instruction data trains only some tokens) make a micro-batch's own mean depend on how the
global batch was split: a micro-batch of few trained tokens would weigh as much as one of many. So within
`global_batch(trained, sequences, width)` -- the trained targets of the whole global batch, its sequences and
their width, all known from the data alone -- a micro-batch's loss is its sum over trained tokens scaled so
that the equal-weight mean every strategy takes (over micro-batches, pipeline micro-batches, data- and
context-parallel ranks: all calls of one global batch cover equally many sequences, or equal shares of them)
is the sum over the global batch's trained tokens divided by their count: the same number, and gradient, for
every layout. Without masked targets the scale is one and this is the plain mean. Where rows hold one example
each (width None) a micro-batch is as wide as its longest row, so a call's share is counted in rows, not
positions (context parallelism, which splits positions, is refused there).

This is the normalisation of transformers' Trainer, which TRL's SFTTrainer keeps: each micro-batch's loss is
its sum over trained targets divided by `num_items_in_batch`, the trained targets of every micro-batch of the
optimizer step on every rank, and the gradients of the step's micro-batches and ranks add up.

`micro_batch_weight` is the factor a strategy scales one micro-batch's loss by before backward (1/n for
n accumulated micro-batches): a model that adds a loss of its own to the graph (MoE balancing) weights
it alike, so the step's gradient does not depend on how the batch is split.

A model that owns its output head may instead return its final hidden states and leave the head to the
loss (`deferred_logits`, what model.loss_chunk_tokens > 0 does in training): the loss then projects,
upcasts and scores `chunk_tokens` tokens at a time, each chunk under torch.utils.checkpoint, so neither
the forward nor the backward ever holds more than one chunk's fp32 logits (and their gradient). Same
value and gradient as projecting everything at once, up to the order of the sums.

The head travels beside the tensor, not on it: wrappers between the model and the loss (FSDP2's
backward hooks, DeepSpeed's engine, a pipeline stage) may hand on a new tensor object. Every caller
computes a micro-batch's loss right after its forward, in the same thread, so a per-thread queue pairs
them; a shape that does not match the deferred hidden states is a bug and raises.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100     # F.cross_entropy's default: targets equal to it add nothing and are not counted

_weight = [1.0]
_global: list = [None]      # (trained targets, sequences, width) of the global batch being run


@contextlib.contextmanager
def weighted_micro_batch(weight: float):
    """Within: backward scales this micro-batch's loss by `weight`."""
    previous, _weight[0] = _weight[0], weight
    try:
        yield
    finally:
        _weight[0] = previous


def micro_batch_weight() -> float:
    return _weight[0]


@contextlib.contextmanager
def global_batch(trained: int | None, sequences: int, width: int | None):
    """Within: losses are shares of this global batch's mean over its `trained` targets (None: every position of
    its `sequences` rows of `width` is trained, the plain mean). `width` None: rows of one example each, as wide
    as their micro-batch's longest."""
    plain = trained is None or (width is not None and trained == sequences * width)
    previous, _global[0] = _global[0], None if plain else (trained, sequences, width)
    try:
        yield
    finally:
        _global[0] = previous


def _mean(loss_sum: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A sum of per-token losses as this micro-batch's loss: its share of the global batch's mean (see above),
    or, outside a global batch, its own mean over trained targets."""
    if _global[0] is None:
        return loss_sum / (targets != IGNORE_INDEX).sum().clamp(min=1)
    trained, sequences, width = _global[0]
    rows = targets.numel() / width if width is not None else targets.shape[0]   # a context-parallel shard: a share
    return loss_sum * (sequences / rows / max(trained, 1))


_deferred = threading.local()


def _queue() -> deque:
    if not hasattr(_deferred, "heads"):
        _deferred.heads = deque()
    return _deferred.heads


def deferred_logits(hidden: torch.Tensor, head, chunk_tokens: int) -> torch.Tensor:
    """Return `hidden` (..., dim); the next `cross_entropy` on this thread computes head(hidden) by chunks."""
    _queue().append((head, chunk_tokens, hidden.shape))
    return hidden


def cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if _queue():
        head, chunk_tokens, shape = _queue().popleft()
        if output.shape != shape:
            raise RuntimeError(f"the loss got a {tuple(output.shape)} output where the model deferred its head "
                               f"on {tuple(shape)} hidden states")
        return chunked_cross_entropy(output, head, targets, chunk_tokens)
    if _global[0] is None:
        return F.cross_entropy(output.flatten(0, -2).float(), targets.flatten())
    return _mean(F.cross_entropy(output.flatten(0, -2).float(), targets.flatten(), reduction="sum"), targets)


def _chunk_loss_sum(head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum", ignore_index=IGNORE_INDEX)


def chunked_cross_entropy(hidden: torch.Tensor, head, targets: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """mean cross_entropy(head(hidden), targets) with at most `chunk_tokens` tokens' logits alive at once."""
    flat_hidden, flat_targets = hidden.flatten(0, -2), targets.flatten()
    total = hidden.new_zeros((), dtype=torch.float32)
    for h, t in zip(flat_hidden.split(chunk_tokens), flat_targets.split(chunk_tokens)):
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_loss_sum, head, h, t, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(head, h, t)
    return _mean(total, targets)


def _chunk_token_logps(head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -F.cross_entropy(head(hidden).float(), targets, reduction="none", ignore_index=IGNORE_INDEX)


def token_logps(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) of each position, in fp32 (float64 for a float64 model), 0 where the target is IGNORE_INDEX:
    a (batch, positions) tensor, for objectives that score whole sequences (framework/objectives/preference.py).
    A deferred head (model.loss_chunk_tokens) is applied chunk by chunk, each under torch.utils.checkpoint, as
    `cross_entropy` does."""
    if _queue():
        head, chunk_tokens, shape = _queue().popleft()
        if output.shape != shape:
            raise RuntimeError(f"the objective got a {tuple(output.shape)} output where the model deferred its head "
                               f"on {tuple(shape)} hidden states")
        parts = []
        for h, t in zip(output.flatten(0, -2).split(chunk_tokens), targets.flatten().split(chunk_tokens)):
            parts.append(checkpoint(_chunk_token_logps, head, h, t, use_reentrant=False)
                         if torch.is_grad_enabled() else _chunk_token_logps(head, h, t))
        return torch.cat(parts).view(targets.shape)
    logits = output.flatten(0, -2)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return -F.cross_entropy(logits, targets.flatten(), reduction="none",
                            ignore_index=IGNORE_INDEX).view(targets.shape)
