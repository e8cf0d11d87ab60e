"""Step directories on disk or in a bucket: complete-or-absent saves, newest-complete lookup, retention,
compatibility checks.

    <checkpoint.dir>/step_00000008/
        meta.json         written last: its presence marks the checkpoint complete; "files" holds the
                          size and CRC-32 of every other file, checked before a load (signed, with
                          FRAMEWORK_CHECKPOINT_KEY set: their SHA-256 too, and meta.json's signature)
        config.yaml       the resolved config of the run that saved it
        trainer.json      step (= data position: batches depend only on seed and step)
        state/            the strategy's own state (DCP shards, or DeepSpeed's engine files)
        rng/rank_00000.pt RNG states per rank (tensors only)
        tokenizer.json    a copy of the data's tokenizer, when it has one (byte-level data records none)

On a file system a save goes to `.step_00000008.partial/` and is renamed into place by rank 0 after every
rank finished writing, so a crash mid-save leaves only a `.partial` dir that lookups ignore, and the
previous checkpoint is never touched. Object stores (checkpoint.dir=s3://..., any fsspec URL:
framework.storage) have no rename: a save writes into `step_00000008/` itself and meta.json, written by rank
0 after every rank's objects are in and checksummed, is what makes it complete; leftovers of an earlier
attempt at the same step are deleted first, meta.json before the rest.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import re
import shutil

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from framework import storage
from framework.checkpoint.manifest import first_damage, shared_first_damage, shared_manifest
from framework.checkpoint.retention import Saved, kept_steps, score_of
from framework.checkpoint.signing import signature_problem, signed, signing_key
from framework.checkpoint.unpickle import UnsafeCheckpointError, load_torch
from framework.data import tokenizer
from framework.redact import redacted_yaml
from framework.runtime import faults

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


def fingerprint(cfg) -> dict:
    """What a checkpoint must agree on with the run that loads it (the layout may differ)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    return {"model": model, "optimizer": cfg.optimizer._target_, "vocab_size": cfg.data.vocab_size}


def _model_defaults(cfg) -> dict:
    """The model schema's defaults: a key a newer version added reads as its default in an older checkpoint."""
    schema = OmegaConf.get_type(cfg.model)
    if not dataclasses.is_dataclass(schema):
        return {}
    out = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def read_meta(path: str) -> dict:
    try:
        return json.loads(storage.read_text(storage.join(path, META)))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a complete checkpoint (no {META})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}/{META} is corrupt ({e.msg})") from None


def check_compatible(path: str, cfg, strategy_format: str) -> dict:
    """Refuse a checkpoint this run cannot continue from, naming the first difference."""
    meta = read_meta(path)
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {meta.get('version')}, "
                              f"this framework reads {FORMAT_VERSION}")
    if meta["format"] != strategy_format:
        raise CheckpointError(f"{path} holds {meta['format']} state (saved by parallel={meta['parallel']}); "
                              f"to move weights across, export it with `python -m framework.export` and start "
                              f"with checkpoint.initial_load")
    saved, now = meta["fingerprint"], fingerprint(cfg)
    saved["model"] = {**_model_defaults(cfg), **saved.get("model", {})}   # keys added since it was saved
    for key in now:
        if saved.get(key) != now[key]:
            if key == "model":
                diff = sorted(k for k in set(saved[key]) | set(now[key]) if saved[key].get(k) != now[key].get(k))
                detail = ", ".join(f"model.{k}: saved {saved[key].get(k)} vs now {now[key].get(k)}" for k in diff)
            else:
                detail = f"saved {saved.get(key)} vs now {now[key]}"
            raise CheckpointError(f"{path} was saved for a different {key} ({detail})")
    if not storage.listdir(storage.join(path, STATE)):
        raise CheckpointError(f"{path} has no {STATE}/ data")
    return meta


def damage(path: str, shared: bool = False) -> str | None:
    """What is wrong with the first of a checkpoint's files that differs from its manifest (None: all
    match, or a checkpoint saved before manifests). With FRAMEWORK_CHECKPOINT_KEY set: meta.json's signature,
    then every file by its signed SHA-256. `shared`: every rank of the process group reads its share of the
    files (a collective). Raises signing.SigningKeyError for a key that is set but unusable."""
    meta, key = read_meta(path), signing_key()
    if key is not None:
        problem = signature_problem(meta, key)
        if problem is not None:
            return f"{storage.join(path, META)} {problem}"
        return (shared_first_damage if shared else first_damage)(path, meta.get("files") or {}, signed=True,
                                                                  unlisted=(META,))
    manifest = meta.get("files")
    return first_damage(path, manifest) if manifest is not None else None


def newest_intact_beside(path: str) -> str | None:
    """The newest other complete checkpoint in path's directory whose files all match its manifest."""
    for other in reversed(complete_checkpoints(storage.parent(path))):
        if _same(other, path):
            continue
        try:
            if damage(other) is None:
                return other
        except CheckpointError:
            continue
    return None


def check_intact(path: str) -> None:
    """Refuse a checkpoint whose files differ from its manifest, naming the newest intact one beside it."""
    found = damage(path)
    if found is None:
        return
    intact = newest_intact_beside(path)
    advice = (f"the newest intact checkpoint is {intact}: resume with checkpoint.resume={intact}" if intact
              else "no intact checkpoint is left beside it; start without checkpoint.resume")
    raise CheckpointError(f"refusing {path}: {found}; {advice}")


def completed_checkpoint(cfg, run_dir: str) -> str | None:
    """With checkpoint.resume=auto, the newest checkpoint when it is already at trainer.max_steps: a re-run
    of a finished job (a re-submitted sweep, a requeued cluster job) has nothing left to do."""
    if cfg.checkpoint.resume != "auto":
        return None
    found = complete_checkpoints(checkpoint_dir(cfg, run_dir))
    if not found:
        return None
    try:
        step = int(read_meta(found[-1])["step"])
    except (CheckpointError, KeyError, ValueError):
        return None
    return found[-1] if step >= cfg.trainer.max_steps else None


def resolve_resume(cfg, run_dir: str, continues: bool = False, announce: bool = False) -> str | None:
    """checkpoint.resume: null -> None; auto -> newest complete (or None); a path -> that path.
    `continues`: this worker group re-forms an earlier one of the job (framework.runtime.elastic).
    `announce` (the trainer's rank 0): say in one line where auto looked and what it found, so that a
    requeued job that starts over in an empty dir says so."""
    resume = cfg.checkpoint.resume
    if continues and cfg.checkpoint.enabled and not resume:
        resume = "auto"   # a restarted worker group continues from where the last one saved
    if not resume:
        return None
    if resume == "auto":
        where = checkpoint_dir(cfg, run_dir)
        found = complete_checkpoints(where)
        if announce:
            print(f"checkpoint.resume=auto: looked in {where}: "
                  + (f"resuming from {found[-1]}" if found else "no complete checkpoint, starting at step 0"),
                  flush=True)
        return found[-1] if found else None
    return resume


def _same(a: str, b: str) -> bool:
    if storage.is_url(a) or storage.is_url(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.abspath(a) == os.path.abspath(b)


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
        self.root = checkpoint_dir(cfg, run_dir)
        self.in_place = storage.is_url(self.root)     # an object store: no rename, meta.json completes a save
        self._pending = None

    def should_save(self, step: int, is_last: bool) -> bool:
        c = self.cfg.checkpoint
        return c.enabled and (is_last or (c.interval > 0 and step % c.interval == 0))

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


def read_rng(path: str) -> dict:
    """A rank's RNG states as saved (tensors only: anything else is refused)."""
    return load_torch(storage.read_bytes(path), path)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(),
             "numpy": torch.from_numpy(np.frombuffer(json.dumps(_numpy_state()).encode(), dtype=np.uint8).copy()),
             "python": torch.tensor(list(json.dumps(random.getstate()).encode()), dtype=torch.uint8)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _numpy_state() -> list:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), pos, has_gauss, cached]


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = json.loads(bytes(state["numpy"].tolist()).decode())
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = json.loads(bytes(state["python"].tolist()).decode())
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
