"""Layout-independent batches.

A stream is cut into sequences of seq_len + 1 tokens (input plus the shifted target), one of three ways:
  - Windows: non-overlapping windows of the token stream, across document boundaries (pretraining). With
    data.document_mask each window also carries its tokens' document numbers: attention stays within a
    document and positions restart at each document's start.
  - Packed: instruction data (a loss mask) is packed whole: examples in order fill a sequence until the next
    does not fit, the rest is padding. An example longer than a sequence is split into sequence-long pieces,
    or cut to one (data.overlong). A piece's first token and the padding are never trained targets.
  - One example a row (data.packing=false, framework/data/examples.py): each micro-batch as wide as its longest.
Each epoch visits the sequences in a permutation drawn from (seed, epoch). Global step k takes the next
global batch of that endless order (global_batch_size sequences, or during a batch-size ramp the ramp's size,
starting after the earlier steps' sequences: data/ramp.py), so the sequences of a step depend only on the seed and
k, never on how many ranks share them. A data-parallel rank takes its contiguous slice of the global batch;
the data position to checkpoint is just the step. How many targets a global batch trains is known from the
data alone (`trained_tokens`): the loss of every layout is the mean over the same tokens.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from framework.data.examples import OneExampleARow, Pairs, cut_counts
from framework.data.ramp import BatchSizes
from framework.data.rows import PAD_ID, Rows
from framework.models.loss import IGNORE_INDEX


class Windows:
    """Fixed windows of seq_len + 1 tokens over the stream (the last token of one is the first of the next)."""

    def __init__(self, tokens, seq_len: int, starts: Optional[np.ndarray] = None):
        self.tokens, self.seq_len, self.starts = tokens, seq_len, starts
        self.count = (len(tokens) - 1) // seq_len

    def __len__(self) -> int:
        return self.count

    def rows(self, ids) -> "Rows | torch.Tensor":
        s = self.seq_len
        tokens = torch.from_numpy(np.stack([np.asarray(self.tokens[i * s: i * s + s + 1], dtype=np.int64)
                                            for i in ids]))
        if self.starts is None:
            return tokens
        positions = np.asarray(ids, dtype=np.int64)[:, None] * s + np.arange(s + 1)
        documents = np.searchsorted(self.starts, positions, side="right") - 1
        return Rows(tokens, None, torch.from_numpy((documents - documents[:, :1]).astype(np.int32)))

    def trained(self, ids) -> Optional[int]:
        return None


def plan_packing(starts: np.ndarray, row: int, overlong: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whole documents, in order, into rows of `row` tokens: (piece starts, piece lengths, the first piece of
    every row, then the piece count). A document longer than a row is split into row-long pieces, or cut."""
    piece_start, piece_len, row_first = [], [], []
    fill = row
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        if b - a > row and overlong == "truncate":
            b = a + row
        for p in range(a, b, row):
            length = min(row, b - p)
            if fill + length > row:
                row_first.append(len(piece_start))
                fill = 0
            piece_start.append(p)
            piece_len.append(length)
            fill += length
    row_first.append(len(piece_start))
    return np.asarray(piece_start, np.int64), np.asarray(piece_len, np.int64), np.asarray(row_first, np.int64)


class Packed:
    """Whole examples packed into rows of seq_len + 1 tokens, each with its document numbers and trained mask."""

    def __init__(self, tokens, mask, starts: np.ndarray, seq_len: int, overlong: str = "split",
                 document_mask: bool = True):
        self.tokens, self.mask, self.seq_len, self.document_mask = tokens, mask, seq_len, document_mask
        self.piece_start, self.piece_len, self.row_first = plan_packing(np.asarray(starts), seq_len + 1, overlong)
        self.count = len(self.row_first) - 1
        self._trained_counts: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self.count

    def _pieces(self, i: int):
        for p in range(self.row_first[i], self.row_first[i + 1]):
            yield int(self.piece_start[p]), int(self.piece_len[p])

    def rows(self, ids) -> Rows:
        n, width = len(ids), self.seq_len + 1
        tokens = np.full((n, width), PAD_ID, dtype=np.int64)
        trained = np.zeros((n, width), dtype=bool)
        documents = np.zeros((n, width), dtype=np.int32)
        for r, i in enumerate(ids):
            at = 0
            for d, (start, length) in enumerate(self._pieces(int(i))):
                tokens[r, at:at + length] = np.asarray(self.tokens[start:start + length])
                trained[r, at + 1:at + length] = np.asarray(self.mask[start + 1:start + length]) != 0
                documents[r, at:at + length] = d
                at += length
            documents[r, at:] = documents[r, at - 1] + 1 if at else 0    # the padding is a document of its own
        return Rows(torch.from_numpy(tokens), torch.from_numpy(trained),
                    torch.from_numpy(documents) if self.document_mask else None)

    def trained_counts(self) -> np.ndarray:
        """Trained targets of every row (computed once: one pass over the mask)."""
        if self._trained_counts is None:
            counts = np.zeros(len(self.piece_start), dtype=np.int64)
            for p, (start, length) in enumerate(zip(self.piece_start.tolist(), self.piece_len.tolist())):
                counts[p] = int(np.count_nonzero(np.asarray(self.mask[start + 1:start + length])))
            self._trained_counts = np.add.reduceat(counts, self.row_first[:-1]) if self.count else counts[:0]
        return self._trained_counts

    def trained(self, ids) -> Optional[int]:
        return int(self.trained_counts()[np.asarray(ids, dtype=np.int64)].sum())


class GlobalBatchSampler:
    def __init__(self, tokens, seq_len: int, global_batch_size: BatchSizes | int, seed: int,
                 shuffle: bool = True, stream: tuple[int, ...] = ()):
        """`tokens`: a token stream (cut into Windows) or sequences already laid out (Windows, Packed,
        OneExampleARow)."""
        self.layout = tokens if isinstance(tokens, (Windows, Packed, OneExampleARow, Pairs)) else Windows(tokens, seq_len)
        #: rows as wide as seq_len + 1, or None: one example a row, each micro-batch as wide as its longest
        self.width = None if isinstance(self.layout, (OneExampleARow, Pairs)) else seq_len
        #: what data.seq_len cut of the data's examples (examples.cut_counts), set by build_samplers
        self.cut: dict[str, int] = {}
        self.stream = stream   # extra seed words: a mixture gives each source its own order
        self.seq_len = seq_len
        self.batch_sizes = BatchSizes.of(global_batch_size)
        self.global_batch_size = self.batch_sizes.final
        self.seed = seed
        self.shuffle = shuffle
        self.num_sequences = len(self.layout)
        if self.num_sequences < 1:
            raise ValueError(f"{len(tokens)} tokens are fewer than one sequence of {seq_len + 1}")
        self._epoch_cache: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_cache:
            if not self.shuffle:
                order = np.arange(self.num_sequences)
            else:
                order = np.random.default_rng([self.seed, epoch, *self.stream]).permutation(self.num_sequences)
            self._epoch_cache = {epoch: order}
        return self._epoch_cache[epoch]

    def ids_at(self, positions) -> np.ndarray:
        """Sequence ids at these positions of the endless, epoch-by-epoch shuffled order."""
        ids = []
        for pos in positions:
            epoch, idx = divmod(int(pos), self.num_sequences)
            ids.append(self._order(epoch)[idx])
        return np.asarray(ids, dtype=np.int64)

    def sequence_ids(self, step: int) -> np.ndarray:
        start = self.batch_sizes.offset(step)
        return self.ids_at(range(start, start + self.batch_sizes.size(step)))

    def sequences(self, ids: np.ndarray) -> "Rows | torch.Tensor":
        return self.layout.rows(ids)

    def local_batch(self, step: int, dp_rank: int, dp_size: int) -> "Rows | torch.Tensor":
        """This data-parallel rank's (the step's global batch / dp_size, seq_len + 1) slice of step `step`."""
        ids = self.sequence_ids(step)
        per_rank = self.batch_sizes.size(step) // dp_size
        return self.sequences(ids[dp_rank * per_rank:(dp_rank + 1) * per_rank])

    def trained_tokens(self, step: int) -> Optional[int]:
        """Targets step `step`'s global batch trains (None: every one of its positions)."""
        return self.layout.trained(self.sequence_ids(step))

    def chosen_targets(self, step: int) -> int:
        """Preference pairs: the targets of step `step`'s chosen sequences whole, prompt included (Pairs)."""
        return self.layout.chosen_targets(self.sequence_ids(step))

    def tokens(self, after_step: int, to_step: int) -> int:
        """Tokens of the steps after `after_step` up to `to_step` (1-based, inclusive): every position of their
        rows, or where rows hold one example each, the examples' tokens (padding left out, as TRL counts)."""
        if not isinstance(self.layout, (OneExampleARow, Pairs)):
            return (self.batch_sizes.offset(to_step) - self.batch_sizes.offset(after_step)) * self.seq_len
        return sum(self.layout.tokens_of(self.sequence_ids(step)) for step in range(after_step, to_step))

    def consumed(self, steps: int) -> dict[str, int]:
        """Per-source token counts after `steps` steps: a single source has nothing to add."""
        return {}


def layout_of(stream, data_cfg):
    """How a stream is cut into sequences: instruction data (a loss mask) packed whole or one example a row
    (data.packing), anything else in windows, with document numbers where data.document_mask asks for them and
    the data knows its documents."""
    document_mask = bool(data_cfg.get("document_mask"))     # a config written before the key existed: off
    if stream.manifest and stream.manifest.get("pairs"):
        return Pairs(stream.tokens, stream.mask, stream.starts, data_cfg.seq_len, data_cfg.get("max_prompt_length"))
    if stream.mask is not None and not data_cfg.get("packing", True):
        return OneExampleARow(stream.tokens, stream.mask, stream.starts, data_cfg.seq_len)
    if stream.mask is not None:
        return Packed(stream.tokens, stream.mask, stream.starts, data_cfg.seq_len, data_cfg.overlong, document_mask)
    starts = stream.starts if document_mask else None
    return Windows(stream.tokens, data_cfg.seq_len, starts)


def build_samplers(data_cfg, global_batch_size: BatchSizes | int, seed: int, with_val: bool):
    """(train sampler, validation sampler or None) for the configured data; validation batches take the
    final global batch size."""
    from framework.data.mixture import MixtureSampler
    from framework.data.sources import source_of

    source = source_of(data_cfg)
    found = source.streams(data_cfg)
    final = BatchSizes.of(global_batch_size).final
    splits = [[layout_of(part, data_cfg) for part in split_stream(s, data_cfg.val_fraction)] for s in found]
    if not source.mixture:
        train, val = splits[0]
        train_sampler, val_sampler = (GlobalBatchSampler(train, data_cfg.seq_len, global_batch_size, seed),
                                      GlobalBatchSampler(val, data_cfg.seq_len, final, seed, shuffle=False)
                                      if with_val else None)
    else:
        weights, names = [s.weight for s in found], [s.name for s in found]
        mix = lambda index, shuffle, sizes: MixtureSampler(
            [GlobalBatchSampler(split[index], data_cfg.seq_len, 1, seed, shuffle, stream=(i + 1,))
             for i, split in enumerate(splits)], weights, names, sizes, seed)
        train_sampler, val_sampler = mix(0, True, global_batch_size), (mix(1, False, final) if with_val else None)
    train = train_sampler.layout if not source.mixture else None
    train_sampler.cut = train.counts if isinstance(train, Pairs) else data_cut(found, data_cfg)
    return train_sampler, val_sampler


def data_cut(streams, data_cfg) -> dict[str, int]:
    """What data.seq_len cuts of the examples of every stream that holds them, summed ({} for token streams)."""
    counts: dict[str, int] = {}
    for stream in (s for s in streams if s.mask is not None):
        found = cut_counts(stream.starts, stream.mask, data_cfg.seq_len, data_cfg.get("packing", True),
                           data_cfg.overlong)
        counts = {k: counts.get(k, 0) + v for k, v in found.items()}
    return counts


def split_train_val(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    n_val = int(len(tokens) * val_fraction)
    if n_val == 0:
        return tokens, tokens[:0]
    return tokens[:-n_val], tokens[-n_val:]


def split_stream(stream, val_fraction: float):
    """(train, validation) parts of a stream: the last val_fraction of its tokens, or of its documents where
    it is packed (instruction data), so that no example is cut in two."""
    from dataclasses import replace
    if stream.mask is None:
        train, val = split_train_val(stream.tokens, val_fraction)
        if stream.starts is None:
            return replace(stream, tokens=train), replace(stream, tokens=val)
        starts = np.asarray(stream.starts)
        cut = len(train)
        inner = starts[(starts > 0) & (starts < cut)]
        return (replace(stream, tokens=train, starts=np.concatenate([[0], inner, [cut]])),
                replace(stream, tokens=val, starts=np.concatenate([[0], starts[starts > cut] - cut]) if len(val) else
                        np.zeros(1, np.int64)))
    starts = np.asarray(stream.starts)
    docs = len(starts) - 1
    held = int(docs * val_fraction)
    if stream.manifest and stream.manifest.get("pairs"):
        held -= held % 2            # preference pairs: two examples each, never split
    cut_doc = docs - held
    cut = int(starts[cut_doc])
    return (replace(stream, tokens=stream.tokens[:cut], mask=stream.mask[:cut], starts=starts[:cut_doc + 1]),
            replace(stream, tokens=stream.tokens[cut:], mask=stream.mask[cut:], starts=starts[cut_doc:] - cut))


def micro_batches(local, micro_batch_size: int, width: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Cut a rank's slice into (inputs, targets) micro-batches, targets not trained set to IGNORE_INDEX, and
    the inputs' document numbers third where the rows carry them. Rows of one example each (with lengths) are
    cut to their micro-batch's longest, or padded to `width` where it is given (a compiled model then sees one
    shape: under tensor parallelism torch cannot trace the dynamic shape every new width makes)."""
    if isinstance(local, torch.Tensor):
        return [(chunk[:, :-1], chunk[:, 1:]) for chunk in local.split(micro_batch_size)]
    out = []
    for i in range(0, len(local.tokens), micro_batch_size):
        part = slice(i, i + micro_batch_size)
        if local.lengths is None:
            width_here = local.tokens.shape[1]
        else:
            width_here = width or int(local.lengths[part].max())
        tokens, trained = local.tokens[part, :width_here], local.trained
        if tokens.shape[1] < width_here:
            tokens = F.pad(tokens, (0, width_here - tokens.shape[1]), value=PAD_ID)
            trained = None if trained is None else F.pad(trained, (0, width_here - trained.shape[1]), value=False)
        targets = tokens[:, 1:]
        if trained is not None:
            targets = targets.masked_fill(~trained[part, 1:width_here], IGNORE_INDEX)
        batch = (tokens[:, :-1], targets)
        if local.documents is not None:
            batch += (local.documents[part, :width_here - 1],)
        out.append(batch)
    return out
