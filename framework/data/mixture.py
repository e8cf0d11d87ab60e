"""Weighted mixtures: global batch positions dealt out to sources in fixed proportions.

Positions (the step's offset + j: data/ramp.py) are grouped in blocks of BLOCK. Every block holds the same
number of positions per source (the weights' shares of BLOCK, rounded by largest remainder), arranged
in a permutation drawn from (seed, block). So the source of a position, and how many earlier positions
went to that source (its position in the source's own endless order), are computed from the seed and
the position alone: a step's sequences depend only on seed and step, and resume is exact.
"""
from __future__ import annotations

import numpy as np

from framework.data.ramp import BatchSizes
from framework.data.rows import cat_rows

BLOCK = 1024
MIX_STREAM = 0x6D6978   # seed word that keeps the block permutations apart from the sources' orders


def block_counts(weights: list[float], block: int = BLOCK) -> np.ndarray:
    shares = np.asarray(weights, dtype=np.float64) / float(np.sum(weights)) * block
    counts = np.floor(shares).astype(np.int64)
    for i in np.argsort(-(shares - counts), kind="stable")[:block - int(counts.sum())]:
        counts[i] += 1
    return counts


class MixtureSampler:
    def __init__(self, samplers: list, weights: list[float], names: list[str], global_batch_size: BatchSizes | int,
                 seed: int):
        self.samplers, self.names = samplers, names
        self.batch_sizes, self.seed = BatchSizes.of(global_batch_size), seed
        self.global_batch_size = self.batch_sizes.final
        self.seq_len = samplers[0].seq_len
        self.width = self.seq_len       # every source's rows are seq_len + 1 wide (data.packing=false is refused)
        self.cut: dict[str, int] = {}   # set by build_samplers
        self.counts = block_counts(weights)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(source of each position in block b, how many earlier positions of block b share its source)."""
        if b not in self._cache:
            source = np.random.default_rng([self.seed, MIX_STREAM, b]).permutation(
                np.repeat(np.arange(len(self.counts)), self.counts))
            rank = np.empty(BLOCK, dtype=np.int64)
            for s in range(len(self.counts)):
                where = np.flatnonzero(source == s)
                rank[where] = np.arange(len(where))
            self._cache = {b: (source, rank)}
        return self._cache[b]

    def assign(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """For global positions: (source index, position in that source's own order)."""
        sources, within = [], []
        for pos in positions:
            b, offset = divmod(int(pos), BLOCK)
            source, rank = self._block(b)
            sources.append(source[offset])
            within.append(b * self.counts[source[offset]] + rank[offset])
        return np.asarray(sources), np.asarray(within)

    def local_batch(self, step: int, dp_rank: int, dp_size: int):
        per_rank = self.batch_sizes.size(step) // dp_size
        start = self.batch_sizes.offset(step) + dp_rank * per_rank
        rows = [self.samplers[s].sequences(self.samplers[s].ids_at([p]))
                for s, p in zip(*self.assign(range(start, start + per_rank)))]
        return cat_rows(rows)

    def trained_tokens(self, step: int):
        """Targets step `step`'s global batch trains (None: every position), summed over its sources' sequences."""
        start = self.batch_sizes.offset(step)
        counts = [self.samplers[s].layout.trained(self.samplers[s].ids_at([p]))
                  for s, p in zip(*self.assign(range(start, start + self.batch_sizes.size(step))))]
        if all(c is None for c in counts):
            return None
        return sum(self.seq_len if c is None else c for c in counts)

    def tokens(self, after_step: int, to_step: int) -> int:
        """Tokens of the steps after `after_step` up to `to_step` (1-based, inclusive)."""
        return (self.batch_sizes.offset(to_step) - self.batch_sizes.offset(after_step)) * self.seq_len

    def sequences_per_source(self, positions: int) -> np.ndarray:
        """How many of the first `positions` positions each source supplied."""
        full, partial = divmod(positions, BLOCK)
        source, _ = self._block(full)
        return full * self.counts + np.bincount(source[:partial], minlength=len(self.counts))

    def consumed(self, steps: int) -> dict[str, int]:
        counts = self.sequences_per_source(self.batch_sizes.offset(steps))
        return {f"tokens/{name}": int(n) * self.seq_len for name, n in zip(self.names, counts)}
