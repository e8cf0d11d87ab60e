"""GPUs for sweep points that run at the same time in one process pool on one machine
(`hydra/launcher=joblib` with `hydra.launcher.n_jobs` > 1): each pool worker holds one slot of the
sweep (a lock file under the sweep dir, kept while the worker process lives) and sees only that
slot's share of the visible GPUs through CUDA_VISIBLE_DEVICES. Without this every point counted all
GPUs and its rank 0 used GPU 0. A concurrency the GPUs cannot hold is refused (ConfigError).

The slot and the variable are fixed for the pool worker's life, before anything asks CUDA: the worker's
fork server, started at its first point, passes the same variable to the ranks of every later point.
"""
from __future__ import annotations

import fcntl
import os
from typing import Optional

from framework.errors import ConfigError

_held: Optional[tuple[str, object, str]] = None   # this process's (sweep dir, open slot lock file, GPU slice)


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


def for_this_point(cfg) -> None:
    """Under a Hydra multirun on CUDA: this point's GPUs, before anything else asks CUDA."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    from framework.devices import device_type
    if device_type(cfg) != "cuda":
        return
    import torch
    hydra_cfg = HydraConfig.get()
    share_gpus_among_points(hydra_cfg.launcher, hydra_cfg.sweep.dir, cfg.launcher.nproc_per_node, os.environ,
                            torch.cuda.device_count())
