"""Layout-independent batches.

The token stream is cut into non-overlapping sequences of seq_len + 1 tokens (input plus
the shifted target). Each epoch visits them in a permutation drawn from (seed, epoch).
Global step k takes the next global_batch_size sequences of that endless order, so the
sequences of a step depend only on the seed and k, never on how many ranks share them.
A data-parallel rank takes its contiguous slice of the global batch; the data position
to checkpoint is just the step.
"""
from __future__ import annotations

import numpy as np
import torch


class GlobalBatchSampler:
    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch_size: int, seed: int,
                 shuffle: bool = True, stream: tuple[int, ...] = ()):
        self.tokens = tokens
        self.stream = stream   # extra seed words: a mixture gives each source its own order
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_sequences = (len(tokens) - 1) // seq_len
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
        start = step * self.global_batch_size
        return self.ids_at(range(start, start + self.global_batch_size))

    def sequences(self, ids: np.ndarray) -> torch.Tensor:
        rows = [np.asarray(self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1], dtype=np.int64)
                for i in ids]
        return torch.from_numpy(np.stack(rows))

    def local_batch(self, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """This data-parallel rank's (global_batch_size / dp_size, seq_len + 1) slice of step `step`."""
        ids = self.sequence_ids(step)
        per_rank = self.global_batch_size // dp_size
        return self.sequences(ids[dp_rank * per_rank:(dp_rank + 1) * per_rank])

    def consumed(self, steps: int) -> dict[str, int]:
        """Per-source token counts after `steps` steps: a single source has nothing to add."""
        return {}


def build_samplers(data_cfg, global_batch_size: int, seed: int, with_val: bool):
    """(train sampler, validation sampler or None) for the configured data."""
    from framework.data.mixture import MixtureSampler
    from framework.data.sources import source_of

    source = source_of(data_cfg)
    found = source.streams(data_cfg)
    splits = [split_train_val(s.tokens, data_cfg.val_fraction) for s in found]
    if not source.mixture:
        train, val = splits[0]
        return (GlobalBatchSampler(train, data_cfg.seq_len, global_batch_size, seed),
                GlobalBatchSampler(val, data_cfg.seq_len, global_batch_size, seed, shuffle=False) if with_val else None)
    weights, names = [s.weight for s in found], [s.name for s in found]
    mix = lambda index, shuffle: MixtureSampler(
        [GlobalBatchSampler(split[index], data_cfg.seq_len, 1, seed, shuffle, stream=(i + 1,))
         for i, split in enumerate(splits)], weights, names, global_batch_size, seed)
    return mix(0, True), (mix(1, False) if with_val else None)


def split_train_val(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    n_val = int(len(tokens) * val_fraction)
    if n_val == 0:
        return tokens, tokens[:0]
    return tokens[:-n_val], tokens[-n_val:]


def micro_batches(local: torch.Tensor, micro_batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut a rank's slice into (inputs, targets) micro-batches."""
    return [(chunk[:, :-1], chunk[:, 1:]) for chunk in local.split(micro_batch_size)]
