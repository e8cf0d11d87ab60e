"""Which checkpoint a run resumes (checkpoint.resume: a path, auto, or none), and whether its files are intact:
damage against its manifest (and signature), the newest intact one beside it, a finished job's last save."""
from __future__ import annotations

import os

from framework import storage
from framework.checkpoint.manifest import first_damage, shared_first_damage
from framework.checkpoint.names import META, CheckpointError, checkpoint_dir, complete_checkpoints, read_meta
from framework.checkpoint.signing import signature_problem, signing_key


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
