"""GPUs for sweep points that run at the same time on one machine, each seeing only its own slice of the
machine's GPUs through CUDA_VISIBLE_DEVICES. Without this every point counted all GPUs and its rank 0 used
GPU 0. A concurrency the GPUs cannot hold is refused (ConfigError).

- `hydra/launcher=joblib` with `hydra.launcher.n_jobs` > 1: each pool worker holds one slot of the sweep (a
  lock file under the sweep dir, kept while the worker process lives). The slot and the variable are fixed for
  the pool worker's life, before anything asks CUDA: the worker's fork server, started at its first point,
  passes the same variable to the ranks of every later point.
- `hydra/launcher=local` (submitit's local executor): it starts every point of a batch at once, as tasks
  (one per rank) whose CUDA_VISIBLE_DEVICES it overwrites ('' without gpus_per_node, else the same '0,1,...'
  for every point). So the sweep's own process records the machine's GPUs first (`remember_node_gpus`), and
  in each point its task 0 holds a slot (lock file) while it lives and writes the slice for its other tasks.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from typing import TYPE_CHECKING, Optional

from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.config.schema import Config

_held: Optional[tuple[str, object, str]] = None   # this process's (sweep dir, open slot lock file, GPU slice)
#: the GPUs the machine offers a sweep, recorded by the sweep's own process before its launcher starts points
NODE_GPUS = "FRAMEWORK_SWEEP_NODE_GPUS"
SUBMITIT_LOCAL = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
#: how long a point's other tasks wait for its task 0 to take a slot
SLICE_WAIT_S = 120.0


def concurrent_points(launcher_cfg) -> int:
    """Points the sweep runs at once in this machine's process pool (1 for any other launcher)."""
    if launcher_cfg is None or "joblib" not in str(launcher_cfg.get("_target_", "")):
        return 1
    n = int(launcher_cfg.get("n_jobs", -1))
    return n if n > 0 else max(1, (os.cpu_count() or 1) + 1 + n)   # joblib: -1 is every core


def visible_gpu_ids(env, device_count: int) -> list[str]:
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g for g in given.split(",") if g.strip()][:device_count]
    return [str(i) for i in range(device_count)]


def gpus_per_point(points: int, gpu_count: int, nproc_per_node: Optional[int]) -> int:
    """Each concurrent point's share: launcher.nproc_per_node GPUs, or an even share; refused if they do not fit."""
    per = nproc_per_node or gpu_count // points
    if per == 0 or per * points > gpu_count:
        hold = gpu_count // (nproc_per_node or 1)
        fix = (f"set hydra.launcher.n_jobs to at most {hold}" if hold else "use fewer workers")
        if nproc_per_node and gpu_count // points:
            fix += f" or launcher.nproc_per_node to at most {gpu_count // points}"
        raise ConfigError("hydra.launcher.n_jobs",
                          f"{points} sweep points at once x {per or 1} GPU{'s' if (per or 1) != 1 else ''} each "
                          f"need {points * (per or 1)} GPUs but {gpu_count} are visible; {fix}")
    return per


def claim_slot(sweep_dir: str, points: int) -> tuple[int, object]:
    """The first free slot of the sweep and its open lock file; the lock lasts while the file is open
    (a dead worker frees its own)."""
    lock_dir = os.path.join(sweep_dir, ".gpu_slots")
    os.makedirs(lock_dir, exist_ok=True)
    for slot in range(points):
        f = open(os.path.join(lock_dir, f"slot_{slot}.lock"), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return slot, f
    raise ConfigError("hydra.launcher.n_jobs", f"more than {points} sweep points run at once under {sweep_dir}; "
                                               f"give each sweep its own hydra.sweep.dir")


def share_gpus_among_points(launcher_cfg, sweep_dir: str, nproc_per_node: Optional[int], env,
                            device_count: int) -> Optional[str]:
    """Set env["CUDA_VISIBLE_DEVICES"] to this pool worker's slice (the same for every point it runs) and
    return it; None where points do not share this machine's GPUs."""
    global _held
    points = concurrent_points(launcher_cfg)
    if points == 1 or device_count == 0:
        return None
    if _held is not None and _held[0] == sweep_dir:
        env["CUDA_VISIBLE_DEVICES"] = _held[2]
        return _held[2]
    ids = visible_gpu_ids(env, device_count)
    per = gpus_per_point(points, len(ids), nproc_per_node)
    slot, lock = claim_slot(sweep_dir, points)
    mine = ",".join(ids[slot * per:(slot + 1) * per])
    _held = (sweep_dir, lock, mine)
    env["CUDA_VISIBLE_DEVICES"] = mine
    return mine


def remember_node_gpus(env, device_count: int) -> None:
    """In the process that runs a sweep (before its launcher starts any point): the machine's GPUs, which
    submitit's local executor hides from the points it starts."""
    env.setdefault(NODE_GPUS, ",".join(visible_gpu_ids(env, device_count)))


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _local_executor_slice(ids: list[str], sweep_dir: str, per: int, env) -> str:
    """Task 0 of the point takes the first free slot (held while it lives) and writes the slice, or the
    refusal, for the point's other tasks, which wait for it."""
    job, task = env["SUBMITIT_LOCAL_JOB_ID"], int(env.get("SUBMITIT_LOCAL_LOCALID", "0"))
    decided = os.path.join(sweep_dir, ".gpu_slots", f"job_{job}.json")
    if task == 0:
        slots = len(ids) // per
        try:
            if slots == 0:
                raise ConfigError("launcher.nproc_per_node", f"each sweep point needs {per} GPUs but {len(ids)} "
                                                             f"are visible")
            try:
                slot, lock = claim_slot(sweep_dir, slots)
            except ConfigError:
                raise ConfigError("hydra.launcher", f"hydra/launcher=local starts a batch's sweep points at once; "
                                                    f"{len(ids)} GPUs hold {slots} of launcher.nproc_per_node={per} "
                                                    f"each: sweep at most {slots} points at once "
                                                    f"(hydra.sweeper.max_batch_size={slots})") from None
        except ConfigError as e:
            os.makedirs(os.path.dirname(decided), exist_ok=True)
            _write_atomically(decided, json.dumps({"key": e.key, "error": str(e).partition(": ")[2]}))
            raise
        mine = ",".join(ids[slot * per:(slot + 1) * per])
        global _held
        _held = (sweep_dir, lock, mine)
        _write_atomically(decided, json.dumps({"gpus": mine}))
        return mine
    deadline = time.monotonic() + SLICE_WAIT_S
    while not os.path.exists(decided):
        if time.monotonic() > deadline:
            raise ConfigError("hydra.launcher", f"task 0 of sweep point {job} took no GPU slice within "
                                                f"{SLICE_WAIT_S:.0f} s")
        time.sleep(0.05)
    with open(decided) as f:
        found = json.load(f)
    if "error" in found:
        raise ConfigError(found["key"], found["error"])
    return found["gpus"]


def share_gpus_among_local_jobs(launcher_cfg, sweep_dir: str, nproc_per_node: Optional[int], env) -> Optional[str]:
    """hydra/launcher=local: set env["CUDA_VISIBLE_DEVICES"] to this point's own slice of the machine's GPUs
    (launcher.nproc_per_node of them, one per task) and return it; None on a machine without GPUs."""
    if launcher_cfg is None or launcher_cfg.get("_target_") != SUBMITIT_LOCAL or "SUBMITIT_LOCAL_JOB_ID" not in env:
        return None
    ids = [g for g in env.get(NODE_GPUS, "").split(",") if g.strip()]
    if not ids:
        return None
    if _held is not None and _held[0] == sweep_dir:
        mine = _held[2]
    else:
        mine = _local_executor_slice(ids, sweep_dir, nproc_per_node or 1, env)
    env["CUDA_VISIBLE_DEVICES"] = mine
    return mine


def for_this_point(cfg: Config) -> None:
    """Under a Hydra multirun on CUDA: this point's GPUs, before anything else asks CUDA."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    hydra_cfg = HydraConfig.get()
    if cfg.device != "cpu" and share_gpus_among_local_jobs(hydra_cfg.launcher, hydra_cfg.sweep.dir,
                                                           cfg.launcher.nproc_per_node, os.environ) is not None:
        return
    from framework.runtime.devices import device_type
    if device_type(cfg) != "cuda":
        return
    import torch
    share_gpus_among_points(hydra_cfg.launcher, hydra_cfg.sweep.dir, cfg.launcher.nproc_per_node, os.environ,
                            torch.cuda.device_count())
