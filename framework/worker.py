"""One training process: build the strategy, train, tear down."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from framework.strategies.registry import strategy_class
from framework.trainer import Trainer

PR_SET_PDEATHSIG = 1


def run_worker(cfg, run_dir: str) -> None:
    strategy = strategy_class(cfg.parallel.name)(cfg)
    strategy.setup_distributed()
    Trainer(cfg, strategy, run_dir).fit()
    # Only after success: teardown synchronises all ranks, and a rank that raised must exit at once
    # (its peers may be blocked in a collective) so the elastic agent sees the failure and stops the group.
    strategy.teardown()


def die_with_parent(launcher_pid: int) -> None:
    """A spawned worker must not outlive its launcher, even one killed with SIGKILL (no handler runs)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):    # not Linux: the launcher's signal handlers still stop us
        return
    if os.getppid() != launcher_pid:           # the launcher died before prctl took effect
        os._exit(1)


@record
def worker_entry(run_dir: str, launcher_pid: int) -> None:
    """Entry point of a spawned worker: the resolved config the parent validated and saved."""
    from framework.launch import RESOLVED_CONFIG
    die_with_parent(launcher_pid)
    cfg = OmegaConf.load(os.path.join(run_dir, RESOLVED_CONFIG))
    run_worker(cfg, run_dir)
