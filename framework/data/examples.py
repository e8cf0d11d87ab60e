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
#: what `Pairs` reports instead, for preference data
PAIR_COUNTS = ("data/pairs", "data/pairs_truncated", "data/pairs_dropped", "data/prompts_cut")


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


def prompt_length(mask, start: int, length: int) -> int:
    """Tokens before an example's first trained one: a preference example's prompt (its completion follows whole)."""
    found = np.flatnonzero(np.asarray(mask[start:start + length]))
    return int(found[0]) if len(found) else length


class Pairs:
    """Preference pairs (framework/data/pairs.py: examples two by two, chosen then rejected, the completion
    trained), the sampler's unit: `rows` of pair ids are their examples interleaved, c0, r0, c1, r1, ..., so every
    even split of them (micro-batches, data-parallel ranks) keeps a pair whole. TRL's truncation: a prompt longer
    than `max_prompt_length` (None: no limit) keeps its end (older TRL's rule), then each sequence keeps its first
    seq_len + 1 tokens (TRL 1.16's max_length, keep-start); a pair left with no completion token is dropped and
    counted (TRL drops it silently)."""

    def __init__(self, tokens, mask, starts: np.ndarray, seq_len: int, max_prompt_length: Optional[int] = None):
        self.tokens, self.mask = tokens, mask
        starts = np.asarray(starts, dtype=np.int64)
        start, length = starts[:-1].copy(), np.diff(starts)
        prompts_cut = 0
        if max_prompt_length is not None:
            cut = np.asarray([max(0, prompt_length(mask, int(s), int(n)) - max_prompt_length)
                              for s, n in zip(start.tolist(), length.tolist())], dtype=np.int64)
            start, length = start + cut, length - cut
            prompts_cut = int(np.count_nonzero(cut[0::2]))
        width = seq_len + 1
        trains = np.ones(len(start), dtype=bool)
        for i in np.flatnonzero(length > width):
            trains[i] = trained_targets(mask, int(start[i]), width) > 0
        kept = trains[0::2] & trains[1::2]
        longer = (length[0::2] > width) | (length[1::2] > width)
        self.start = start.reshape(-1, 2)[kept]
        self.length = np.minimum(length, width).reshape(-1, 2)[kept]
        self.counts = dict(zip(PAIR_COUNTS, (len(kept), int(np.count_nonzero(longer & kept)),
                                             int(np.count_nonzero(~kept)), prompts_cut)))

    def __len__(self) -> int:
        return len(self.start)

    def _examples(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return zip(self.start[ids].reshape(-1).tolist(), self.length[ids].reshape(-1).tolist())

    def rows(self, ids) -> Rows:
        return padded([(np.asarray(self.tokens[s:s + n]), np.asarray(self.mask[s:s + n]))
                       for s, n in self._examples(ids)])

    def trained(self, ids) -> Optional[int]:
        return sum(trained_targets(self.mask, s, n) for s, n in self._examples(ids))

    def tokens_of(self, ids) -> int:
        return int(self.length[np.asarray(ids, dtype=np.int64)].sum())

    def chosen_targets(self, ids) -> int:
        """Targets of the pairs' chosen sequences whole, prompt included: every token but the first (what TRL's
        ORPO scores its NLL over)."""
        return int((self.length[np.asarray(ids, dtype=np.int64), 0] - 1).sum())


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
    """`cut_counts` (or `Pairs.counts`) in words, for the run's summary."""
    if "data/pairs" in counts:
        pairs, truncated, dropped, prompts = (counts.get(k, 0) for k in PAIR_COUNTS)
        return (f"{pairs:,} preference pairs (trainer.global_batch_size counts pairs, 2 sequences each)"
                + (f", {prompts:,} prompts cut to data.max_prompt_length" if prompts else "")
                + (f", {truncated:,} with a sequence truncated to {seq_len + 1} tokens (data.seq_len + 1)"
                   if truncated else "")
                + (f", {dropped:,} dropped: the prompt left no completion token" if dropped else ""))
    examples, split, truncated, dropped, cut_tokens = (counts[k] for k in COUNTS)
    row = f"a row of {seq_len + 1} tokens (data.seq_len + 1)"
    if split:
        return f"{examples:,} examples, {split:,} longer than {row}: split into row-long pieces"
    if truncated:
        gone = f"; {dropped:,} of them dropped with no trained token left" if dropped else ""
        return f"{examples:,} examples, {truncated:,} longer than {row}: truncated ({cut_tokens:,} tokens cut){gone}"
    return f"{examples:,} examples, none longer than {row}"
