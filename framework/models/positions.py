"""Which global sequence positions the tokens of a forward pass hold.

A plain forward holds positions 0..seq-1. Under context parallelism a rank holds a load-balanced share
of each sequence (framework.parallel.context_parallel), which sets that share's positions here for the
duration of a step, so that RoPE tables and learned position embeddings follow the global sequence.
"""
from __future__ import annotations

import contextlib

import torch

_held: torch.Tensor | None = None


def token_positions(seq_len: int, device) -> torch.Tensor:
    """The global positions (seq_len,) of the tokens this forward holds."""
    if _held is None:
        return torch.arange(seq_len, device=device)
    if _held.numel() != seq_len:
        raise ValueError(f"a forward of {seq_len} tokens while a shard of {_held.numel()} positions is held")
    return _held.to(device)


def position_rows(table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The rows of a per-position table (RoPE cos/sin) for the tokens this forward holds: a view of the
    first seq_len rows in a plain forward (no copy for autograd to save per layer), a gather under cp."""
    if _held is None:
        return table[:seq_len]
    return table[token_positions(seq_len, table.device)]


@contextlib.contextmanager
def holding(positions: torch.Tensor):
    global _held
    before, _held = _held, positions
    try:
        yield
    finally:
        _held = before
