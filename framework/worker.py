"""One training process: build the strategy, train, tear down."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from framework import exit_codes
from framework.preemption import Preempted, pass_on
from framework.strategies.registry import strategy_class
from framework.trainer import Trainer

PR_SET_PDEATHSIG = 1


def run_worker(cfg, run_dir: str) -> None:
    strategy = strategy_class(cfg.parallel.name)(cfg)
    strategy.setup_distributed()
    try:
        Trainer(cfg, strategy, run_dir).fit()
    except Preempted as e:
        strategy.teardown()
        if strategy.is_main:
            print(f"preempted: {e}; the checkpoint is saved, exit {exit_codes.REQUEUE} asks for a requeue "
                  f"(run again with checkpoint.resume=auto)", file=sys.stderr)
        pass_on(e.signum)
        sys.exit(exit_codes.REQUEUE)
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
def worker_entry(run_dir: str, config_yaml: str, launcher_pid: int) -> None:
    """Entry point of a spawned worker: the resolved config the parent validated."""
    die_with_parent(launcher_pid)
    run_worker(OmegaConf.create(config_yaml), run_dir)
