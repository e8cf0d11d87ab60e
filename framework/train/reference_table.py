"""objective.precompute_reference=true: the reference's log-probs of every pair, computed once before training and
kept with each checkpoint, so that training holds no reference model and a resume reads them back.

The pass scores the pairs with the policy before its first step, at its initial weights: what a frozen copy would
hold (under LoRA, the base with the adapters off: framework/train/reference.py enters that). It runs under the
job's own layout: every global batch of the first epoch's order, each rank its data-parallel share cut into the
training micro-batches, through strategy.eval_loss as the live reference pass does, so the first epoch's steps
read the very numbers a live reference gives them. The ranks' shares are gathered: every rank holds the whole
table, [pairs, 2] (chosen, rejected) by pair id, for the training pairs and the validation pairs.

The table is one safetensors file (tensors only: nothing read from a run executes code) in each checkpoint,
written and committed with it (CheckpointManager.keep_with_each): in a bucket where the checkpoints are, listed
in the checkpoint's manifest, never half there. Its metadata hold each split's pair count and a fingerprint of the
prepared pairs it scored, and the SHA-256 of its tensors. A resume reads it from the checkpoint it loads, before
the state, and refuses one that is damaged or was computed for other data (one line, exit 2: ResumeRefused).
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import torch

from framework.checkpoint.names import ResumeRefused
from framework.data.batches import micro_batches

#: the table's file name in a checkpoint directory
TABLE = "reference_logps.safetensors"
FORMAT = "framework.reference_logps.v1"


def data_fingerprint(layout) -> str:
    """What the log-probs depend on of a split's prepared pairs (framework/data/examples.py Pairs): each kept
    pair's tokens and trained mask after truncation, in pair-id order."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(layout.length, dtype=np.int64).tobytes())
    for start, length in zip(layout.start.reshape(-1).tolist(), layout.length.reshape(-1).tolist()):
        digest.update(np.ascontiguousarray(layout.tokens[start:start + length], dtype=np.int64).tobytes())
        digest.update((np.asarray(layout.mask[start:start + length]) != 0).tobytes())
    return digest.hexdigest()


def _payload_sha256(tables: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tables):
        digest.update(name.encode())
        digest.update(tables[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def encode(tables: dict[str, torch.Tensor], fingerprints: dict[str, str]) -> bytes:
    """The file: each split's [pairs, 2] log-probs, and the metadata a reader checks them by."""
    from safetensors.torch import save
    tables = {name: t.contiguous() for name, t in tables.items()}
    metadata = {"format": FORMAT, "sha256": _payload_sha256(tables),
                **{f"{name}.fingerprint": fingerprints[name] for name in tables}}
    return save(tables, metadata=metadata)


def decode(data: bytes, where: str, expected: dict[str, tuple[int, str]]) -> dict[str, torch.Tensor]:
    """The tables of a file written by `encode`, each checked against `expected` {split: (pairs, fingerprint)}; a
    split it does not hold (evaluation switched on since) is left out, for the caller to score."""
    from safetensors.torch import load
    advice = "start without checkpoint.resume (the pairs are scored again) or with the data it was saved with"
    try:
        (size,) = struct.unpack("<Q", data[:8])
        metadata = json.loads(data[8:8 + size]).get("__metadata__") or {}
        tables = load(data)
    except Exception as e:      # any malformed file: safetensors' own errors have no common base
        raise ResumeRefused(f"refusing {where}: not a table of reference log-probs ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); {advice}") from None
    if metadata.get("format") != FORMAT or metadata.get("sha256") != _payload_sha256(tables):
        raise ResumeRefused(f"refusing {where}: damaged (its log-probs differ from the SHA-256 they were saved "
                            f"with, or it is no {FORMAT} table); {advice}")
    held = {split: expected[split] for split in expected if split in tables}
    for split, (pairs, fingerprint) in held.items():
        if tuple(tables[split].shape) != (pairs, 2):
            raise ResumeRefused(f"refusing {where}: it holds the reference log-probs of {tables[split].shape[0]} "
                                f"{split} pairs, the data has {pairs} now; {advice}")
        if metadata.get(f"{split}.fingerprint") != fingerprint:
            raise ResumeRefused(f"refusing {where}: its {split} log-probs were computed for other pairs (the "
                                f"prepared data's fingerprint differs: data, data.seq_len or "
                                f"data.max_prompt_length changed); {advice}")
    return {split: tables[split] for split in held}


def score(strategy, layout, sampler, objective, width: int | None = None) -> torch.Tensor:
    """[pairs, 2]: the log-probs of every pair of `sampler`'s data as the strategy's model gives them now, in one
    pass over the first epoch's order in global batches of the `layout` (BatchLayout) the strategy is planned for.
    The last batch is filled up from the start of the order (its extra pairs scored twice, kept once); `width`:
    micro-batches as wide as the training ones (StepBatches.width)."""
    pairs, size = sampler.num_sequences, sampler.global_batch_size
    order = sampler.ids_at(range(pairs))
    share = slice(strategy.dp_rank * (size // strategy.dp_size), (strategy.dp_rank + 1) * (size // strategy.dp_size))
    rows, dtype = [], torch.float32
    for first in range(0, pairs, size):
        positions = np.arange(first, first + size)[share]
        local = sampler.sequences(order[positions % pairs]) if strategy.needs_batches else None
        batches = [] if local is None else micro_batches(local, layout.micro_batch * objective.rows_per_example,
                                                         width)
        objective.forget_reference()
        strategy.eval_loss(batches, objective.reference_fn)
        if objective.reference:
            logps = torch.cat(objective.reference).detach()
            dtype = logps.dtype         # float32, or float64 for a float64 model (models/loss.py token_logps)
            logps = logps.to("cpu", torch.float64)
            rows.append(torch.cat([torch.from_numpy(positions).double()[:, None], logps], 1))
    objective.forget_reference()
    mine = torch.cat(rows) if rows else torch.empty(0, 3, dtype=torch.float64)
    every = strategy.all_gather(mine)
    table = torch.full((pairs, 2), float("nan"), dtype=dtype)
    kept = every[:, 0] < pairs              # positions past the end filled the last batch
    table[torch.from_numpy(order)[every[kept, 0].long()]] = every[kept, 1:].to(table.dtype)
    return table
