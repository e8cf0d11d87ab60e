"""Instruction data one example a row (data.packing=false), as TRL's SFTTrainer trains it with packing off.

A row holds one example's first seq_len + 1 tokens: a longer example is truncated, as TRL truncates to
max_length, and one the cut leaves with no trained target is dropped, as TRL drops it. A micro-batch is padded
to its longest row, not to seq_len (micro_batches, batches.py). Which examples a step takes depends on the seed
and the step alone, as for packed rows, so every layout trains the same rows and a resume is exact.

What data.seq_len cuts is counted over a whole stream, packed or not (`cut_counts`): the run's first metrics
record and its summary report it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from framework.data.rows import Rows, padded

#: the counts `cut_counts` reports, as metrics name them
COUNTS = ("data/examples", "data/examples_split", "data/examples_truncated", "data/examples_dropped",
          "data/tokens_truncated")


def trained_targets(mask, start: int, length: int) -> int:
    """Trained targets among an example's first `length` tokens (its first token is never one)."""
    return int(np.count_nonzero(np.asarray(mask[start + 1:start + length])))


def _kept(mask, starts: np.ndarray, width: int) -> np.ndarray:
    """Per example: whether its first `width` tokens still train a target (only a cut one can lose them all)."""
    kept = np.ones(len(starts) - 1, dtype=bool)
    for i in np.flatnonzero(np.diff(starts) > width):
        kept[i] = trained_targets(mask, int(starts[i]), width) > 0
    return kept


class OneExampleARow:
    """Every example that keeps a trained target, cut to seq_len + 1 tokens, one a row (rows.padded)."""

    def __init__(self, tokens, mask, starts: np.ndarray, seq_len: int):
        self.tokens, self.mask = tokens, mask
        starts = np.asarray(starts, dtype=np.int64)
        kept = _kept(mask, starts, seq_len + 1)
        self.start = starts[:-1][kept]
        self.length = np.minimum(np.diff(starts), seq_len + 1)[kept]

    def __len__(self) -> int:
        return len(self.start)

    def rows(self, ids) -> Rows:
        """The examples `ids`, padded to the longest of them, with each row's length."""
        return padded([(np.asarray(self.tokens[s:s + n]), np.asarray(self.mask[s:s + n]))
                       for s, n in zip(self.start[ids].tolist(), self.length[ids].tolist())])

    def trained(self, ids) -> Optional[int]:
        return sum(trained_targets(self.mask, s, n)
                   for s, n in zip(self.start[ids].tolist(), self.length[ids].tolist()))

    def tokens_of(self, ids) -> int:
        """The tokens the rows `ids` hold, padding left out (what TRL counts as a batch's tokens)."""
        return int(self.length[np.asarray(ids, dtype=np.int64)].sum())


def cut_counts(starts, mask, seq_len: int, packing: bool, overlong: str) -> dict[str, int]:
    """What data.seq_len does to a stream's examples: how many there are; how many are longer than a row
    (seq_len + 1 tokens) and so split into row-long pieces (packed, data.overlong=split) or truncated to one
    (packed with overlong=truncate, or one a row); of the truncated, how many were dropped with no trained
    target left (one a row only: packed rows keep them); and how many tokens the truncation cut off."""
    starts = np.asarray(starts, dtype=np.int64)
    width = seq_len + 1
    lengths = np.diff(starts)
    longer = lengths > width
    truncated = not packing or overlong == "truncate"
    dropped = 0 if packing else int(np.count_nonzero(~_kept(mask, starts, width)))
    return dict(zip(COUNTS, (len(lengths), 0 if truncated else int(longer.sum()), int(longer.sum()) if truncated else 0,
                             dropped, int((lengths[longer] - width).sum()) if truncated else 0)))


def describe_cut(counts: dict[str, int], seq_len: int) -> str:
    """`cut_counts` in words, for the run's summary."""
    examples, split, truncated, dropped, cut_tokens = (counts[k] for k in COUNTS)
    row = f"a row of {seq_len + 1} tokens (data.seq_len + 1)"
    if split:
        return f"{examples:,} examples, {split:,} longer than {row}: split into row-long pieces"
    if truncated:
        gone = f"; {dropped:,} of them dropped with no trained token left" if dropped else ""
        return f"{examples:,} examples, {truncated:,} longer than {row}: truncated ({cut_tokens:,} tokens cut){gone}"
    return f"{examples:,} examples, none longer than {row}"
