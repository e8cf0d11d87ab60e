"""Where the job runs: in this process, in workers spawned through torch's elastic launcher,
or as one worker of an outer torchrun.

Validation happens here, before any worker or process group exists. Spawned workers do not
compose the config again: they read the resolved config that the parent wrote to the run dir.
"""
from __future__ import annotations

import os
import shutil
import sys
import uuid
from datetime import timedelta

from omegaconf import DictConfig, OmegaConf

from framework.config.errors import ConfigError
from framework.config.validate import validate
from framework.strategies.registry import strategy_class

RESOLVED_CONFIG = "config.yaml"


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def world_size_for(cfg: DictConfig, strategy_cls) -> int:
    if under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    return cfg.launcher.nproc_per_node or strategy_cls.default_world_size(cfg)


def agree_run_dir(candidate: str) -> str:
    """Under torchrun every rank composes its own config; all must use rank 0's run dir.

    torchrun's agent hosts a key-value store that every worker reaches at MASTER_ADDR:MASTER_PORT.
    Rank 0 publishes its run dir there (keeping an earlier one after an elastic restart, so a
    restarted group resumes in the same dir); the others wait for it.
    """
    if not under_torchrun() or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return candidate
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return os.path.join("outputs", "torchrun", os.environ["TORCHELASTIC_RUN_ID"])
    from torch.distributed import TCPStore
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=timedelta(seconds=300))
    key = f"framework/run_dir/{os.environ['TORCHELASTIC_RUN_ID']}"
    if is_rank_zero():
        return store.compare_set(key, "", candidate).decode()
    return store.get(key).decode()


def hydra_output_subdir(name: str):
    """Only rank 0 writes Hydra's own files into the shared run dir."""
    return name if is_rank_zero() else None


def _remove_if_only_hydra_files(run_dir: str) -> None:
    """Hydra makes the run dir before the job starts; a rejected config should leave nothing behind."""
    if is_rank_zero() and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= {".hydra"}:
        shutil.rmtree(run_dir, ignore_errors=True)


def run(cfg: DictConfig, run_dir: str) -> None:
    """Validate, then train; returns normally on success, exits 2 on a configuration error."""
    try:
        strategy_cls = strategy_class(cfg.parallel.name)
        world_size = world_size_for(cfg, strategy_cls)
        validate(cfg, world_size, strategy_cls, run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        _remove_if_only_hydra_files(run_dir)
        sys.exit(2)

    if is_rank_zero():
        os.makedirs(run_dir, exist_ok=True)
        OmegaConf.save(cfg, os.path.join(run_dir, RESOLVED_CONFIG), resolve=True)

    from framework.worker import run_worker
    if under_torchrun() or world_size == 1:
        run_worker(cfg, run_dir)
    else:
        spawn_workers(cfg, world_size, run_dir)


def spawn_workers(cfg: DictConfig, nproc: int, run_dir: str) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from framework.worker import worker_entry

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc,
        run_id=f"framework-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0",
        max_restarts=cfg.launcher.max_restarts,
        monitor_interval=cfg.launcher.monitor_interval,
        start_method="spawn",
    )
    try:
        elastic_launch(config, worker_entry)(os.path.abspath(run_dir),
                                             os.path.abspath(os.path.join(run_dir, RESOLVED_CONFIG)))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
        print(f"error: worker rank {rank} failed with exit code {failure.exitcode}: "
              f"{message or 'see its output above'}", file=sys.stderr)
        sys.exit(1)
