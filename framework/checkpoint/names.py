"""Step directories on disk or in a bucket: complete-or-absent saves, newest-complete lookup, retention,
compatibility checks. This module: the names of
a checkpoint's files, the step directories that are complete, their meta.json.

    <checkpoint.dir>/step_00000008/
        meta.json         written last: its presence marks the checkpoint complete; "files" holds the
                          size and CRC-32 of every other file, checked before a load (signed, with
                          FRAMEWORK_CHECKPOINT_KEY set: their SHA-256 too, and meta.json's signature)
        config.yaml       the resolved config of the run that saved it
        trainer.json      step (= data position: batches depend only on seed and step)
        state/            the strategy's own state (DCP shards, or DeepSpeed's engine files)
        rng/rank_00000.pt RNG states per rank (tensors only)
        tokenizer.json    a copy of the data's tokenizer, when it has one (byte-level data records none)
        reference_logps.safetensors  objective.precompute_reference: the reference's log-probs of every pair
                          (framework/train/reference_table.py)
"""
from __future__ import annotations

import json
import os
import re

from framework import storage

STEP_DIR = re.compile(r"^step_(\d{8})$")
META, TRAINER, CONFIG, STATE, RNG = "meta.json", "trainer.json", "config.yaml", "state", "rng"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used by this run; reported as a configuration error."""


class ResumeRefused(CheckpointError):
    """A worker's load found the checkpoint unsafe or not the signed one (the launching process checks it
    first: a file changed since, or no launching process checked it)."""


def checkpoint_dir(cfg, run_dir: str) -> str:
    """checkpoint.dir (a path or a URL), else <run dir>/checkpoints."""
    return cfg.checkpoint.dir or os.path.join(run_dir, "checkpoints")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: str) -> list[str]:
    """Complete checkpoints under root, oldest first."""
    found = [(int(m.group(1)), name) for name in storage.listdir(root) if (m := STEP_DIR.match(name))
             and storage.isfile(storage.join(root, name, META))]
    return [storage.join(root, name) for _, name in sorted(found)]


def read_meta(path: str) -> dict:
    try:
        return json.loads(storage.read_text(storage.join(path, META)))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a complete checkpoint (no {META})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/{META} is corrupt ({e.msg})") from None
