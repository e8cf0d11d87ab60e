"""Saving a step: complete-or-absent, then retention (save, commit, prune) and loading one back. The names of a
checkpoint's files are names.py; whether it fits this run compat.py; which one to resume resume.py; RNG states
rng.py.

On a file system a save goes to `.step_00000008.partial/` and is renamed into place by rank 0 after every
rank finished writing, so a crash mid-save leaves only a `.partial` dir that lookups ignore, and the
previous checkpoint is never touched. Object stores (checkpoint.dir=s3://..., any fsspec URL:
framework.storage) have no rename: a save writes into `step_00000008/` itself and meta.json, written by rank
0 after every rank's objects are in and checksummed, is what makes it complete; leftovers of an earlier
attempt at the same step are deleted first, meta.json before the rest.
"""
from __future__ import annotations

import io
import json
import os
import shutil

import torch
import torch.distributed as dist

from framework import storage
from framework.checkpoint.compat import fingerprint
from framework.checkpoint.manifest import shared_manifest
from framework.checkpoint.names import (CONFIG, FORMAT_VERSION, META, RNG, STATE, TRAINER, ResumeRefused,
                                        checkpoint_dir, complete_checkpoints, read_meta, step_dir_name)
from framework.checkpoint.resume import damage, resolve_resume
from framework.checkpoint.retention import Saved, kept_steps, score_of
from framework.checkpoint.rng import read_rng, rng_state, set_rng_state
from framework.checkpoint.signing import signed, signing_key
from framework.checkpoint.unpickle import UnsafeCheckpointError
from framework.data import tokenizer
from framework.redact import redacted_yaml
from framework.runtime import faults


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _write_json(path: str, obj: dict) -> None:
    storage.write_text(path, json.dumps(obj, indent=1))


class CheckpointManager:
    def __init__(self, cfg, run_dir: str, strategy):
        self.cfg = cfg
        self.strategy = strategy
        self.run_dir = run_dir
        self.root = checkpoint_dir(cfg, run_dir)
        self.in_place = storage.is_url(self.root)     # an object store: no rename, meta.json completes a save
        self._pending = None
        self._kept: dict[str, bytes] = {}

    def should_save(self, step: int, is_last: bool) -> bool:
        c = self.cfg.checkpoint
        return c.enabled and (is_last or (c.interval > 0 and step % c.interval == 0))

    def keep_with_each(self, name: str, data: bytes) -> None:
        """A file each checkpoint from now on holds beside the state (rank 0 writes it; the manifest lists it, and
        the save's commit makes it complete with the rest): what the run computed once and a resume reads back."""
        self._kept[name] = data

    def save(self, step: int, record: dict | None = None) -> None:
        """Save this step (`record`: its metrics, where checkpoint.score comes from); with
        checkpoint.async_save the state is written in the background and the checkpoint becomes complete at
        the next save or at finish()."""
        self.finish()
        final = storage.join(self.root, step_dir_name(step))
        target = final if self.in_place else storage.join(self.root, f".{step_dir_name(step)}.partial")
        if _rank() == 0:
            storage.remove_tree(target, first=META)     # an earlier attempt's leftovers (complete or not)
            storage.makedirs(storage.join(target, RNG))
            for name, data in self._kept.items():
                storage.write_bytes(storage.join(target, name), data)
        _barrier()
        buffer = io.BytesIO()
        torch.save(rng_state(), buffer)
        storage.write_bytes(storage.join(target, RNG, f"rank_{_rank():05d}.pt"), buffer.getvalue())
        state_dir = storage.join(target, STATE)
        score = score_of(record, self.cfg.checkpoint.score)
        if self.cfg.checkpoint.async_save:
            self._pending = (self.strategy.save_checkpoint_async(state_dir), step, target, final, score)
        else:
            self.strategy.save_checkpoint(state_dir)
            self._complete(step, target, final, score)

    def finish(self) -> None:
        """Wait for a background save and make it a complete checkpoint."""
        if self._pending is not None:
            future, step, target, final, score = self._pending
            self._pending = None
            future.result()
            self._complete(step, target, final, score)

    def _complete(self, step: int, target: str, final: str, score: float | None) -> None:
        _barrier()
        faults.inject("save", step)    # every rank's shard written, the checkpoint not yet complete
        if _rank() == 0:
            _write_json(storage.join(target, TRAINER), {"step": step})
            storage.write_text(storage.join(target, CONFIG), redacted_yaml(self.cfg))
            tokenizer.record_in(self.cfg.data, target)
        key = signing_key()
        files = shared_manifest(target, skip=(META,), sha256=key is not None)    # every rank checksums its share
        if _rank() == 0:
            meta = {"version": FORMAT_VERSION, "step": step, "format": self.strategy.checkpoint_format,
                    "parallel": self.cfg.parallel.name, "world_size": self.strategy.world_size,
                    "fingerprint": fingerprint(self.cfg), "files": files,
                    "score": {self.cfg.checkpoint.score: score} if score is not None else {}}
            _write_json(storage.join(target, META), signed(meta, key) if key is not None else meta)
            if not self.in_place:
                self._commit(target, final)
            self._prune()
        _barrier()

    def _commit(self, partial: str, final: str) -> None:
        if os.path.exists(final):        # the same step saved again after a restart: swap it in whole
            old = final + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(partial, final)
            shutil.rmtree(old)
        else:
            os.rename(partial, final)

    def _prune(self) -> None:
        c = self.cfg.checkpoint
        found = {path: read_meta(path) for path in complete_checkpoints(self.root)}
        saved = {path: Saved(int(meta["step"]), meta.get("score", {}).get(c.score)) for path, meta in found.items()}
        keep = kept_steps(list(saved.values()), c.keep_last, c.keep_best, c.score_mode)
        for path, s in saved.items():
            if s.step not in keep:
                storage.remove_tree(path, first=META)

    def resume(self, continues: bool, announce: bool) -> int:
        """The step this run continues from: the checkpoint checkpoint.resume names (for a worker group that
        re-forms an earlier one, the newest) loaded, else 0 (resolve_resume says which, `announce` where)."""
        path = self.to_resume(continues, announce)
        return self.load(path) if path else 0

    def to_resume(self, continues: bool, announce: bool) -> str | None:
        """The checkpoint `resume` would load (None: none), for what must be read before the state is."""
        return resolve_resume(self.cfg, self.run_dir, continues, announce)

    def save_unless_saved(self, step: int, saved: bool, before_saving) -> None:
        """A stop between steps (preemption): this step's checkpoint where it has none yet (`before_saving()`
        first: the non-finite check), then any background save completed."""
        if self.cfg.checkpoint.enabled and not saved:
            before_saving()
            self.save(step)
        self.finish()

    def load(self, path: str) -> int:
        """Restore the strategy and RNG states; return the step to continue from. A signed checkpoint is
        verified first (every rank its share of the files), when FRAMEWORK_CHECKPOINT_KEY is set."""
        if signing_key() is not None and (found := damage(path, shared=True)) is not None:
            raise ResumeRefused(f"refusing {path}: {found}")
        try:
            self.strategy.load_checkpoint(storage.join(path, STATE))
            meta = read_meta(path)
            rng_file = storage.join(path, RNG, f"rank_{_rank():05d}.pt")
            if meta["world_size"] == self.strategy.world_size and storage.exists(rng_file):
                set_rng_state(read_rng(rng_file))
        except UnsafeCheckpointError as e:
            raise ResumeRefused(str(e)) from None
        return int(json.loads(storage.read_text(storage.join(path, TRAINER)))["step"])
