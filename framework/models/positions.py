"""Which global sequence positions the tokens of a forward pass hold.

A plain forward holds positions 0..seq-1. Under context parallelism a rank holds a load-balanced share
of each sequence (framework.parallel.context_parallel), which sets that share's positions here for the
duration of a step, so that RoPE tables and learned position embeddings follow the global sequence.
"""
from __future__ import annotations

import contextlib
import weakref

import torch


class _Held:
    """The positions a step holds, and the rows of each per-position table gathered for them so far:
    every layer of a forward reads the same tensor (one gather, one copy autograd saves)."""

    def __init__(self, positions: torch.Tensor):
        self.positions = positions
        self.rows: dict[int, tuple[weakref.ref, torch.Tensor]] = {}     # id(table) -> (table, its rows)

    def rows_of(self, table: torch.Tensor, seq_len: int) -> torch.Tensor:
        key = id(table)
        entry = self.rows.get(key)
        if entry is not None and entry[0]() is table and entry[1].shape[0] == seq_len:
            return entry[1]
        rows = table[token_positions(seq_len, table.device)]
        # the entry, and the rows it keeps alive, go with its table: a forward's tables die with it, so a
        # step of many micro-batches holds one forward's rows, and an id reused later misses
        ref = weakref.ref(table, lambda r, rows=self.rows, key=key: rows.get(key, (None,))[0] is r
                          and rows.pop(key))
        self.rows[key] = (ref, rows)
        return rows


_held: _Held | None = None


def token_positions(seq_len: int, device) -> torch.Tensor:
    """The global positions (seq_len,) of the tokens this forward holds."""
    if _held is None:
        return torch.arange(seq_len, device=device)
    if _held.positions.numel() != seq_len:
        raise ValueError(f"a forward of {seq_len} tokens while a shard of {_held.positions.numel()} "
                         f"positions is held")
    return _held.positions.to(device)


def position_rows(table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The rows of a per-position table (RoPE cos/sin) for the tokens this forward holds: a view of the
    first seq_len rows in a plain forward (no copy for autograd to save per layer); under cp the rows of
    the held positions, gathered once per table (a forward makes its tables once and hands them to every
    layer), so that all layers share one tensor. Inside a compiled region the gather is traced as is."""
    if _held is None:
        return table[:seq_len]
    if torch.compiler.is_compiling():
        return table[token_positions(seq_len, table.device)]
    return _held.rows_of(table, seq_len)


@contextlib.contextmanager
def holding(positions: torch.Tensor):
    """Hold `positions` (and a fresh cache of rows gathered for them) while inside."""
    global _held
    before, _held = _held, _Held(positions)
    try:
        yield
    finally:
        _held = before
