"""One training process: build the strategy, train, tear down."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record

from framework import exit_codes, storage
from framework.checkpoint.names import META, ResumeRefused, checkpoint_dir, step_dir_name
from framework.metrics.gpu_health import GpuFault
from framework.metrics.trackers.base import TrackerError
from framework.runtime import determinism
from framework.runtime.preemption import Preempted, pass_on, report_requeue, signal_number
from framework.storage.timeouts import set_timeout as set_storage_timeout
from framework.strategies.registry import strategy_runtime
from framework.train.step_batches import OutOfMemoryAtOneSequence
from framework.train.trainer import Trainer

if TYPE_CHECKING:
    from framework.config.schema import Config

PR_SET_PDEATHSIG = 1
#: the key a worker's refusal of the checkpoint it resumes is reported under (exit code USAGE)
REFUSED_RESUME = "checkpoint.resume"
PEER_FAILURE_GRACE_S = 2.0


def _peer_failure(e: BaseException) -> bool:
    """A collective that failed because another rank died or hung (gloo/NCCL errors, DistError)."""
    import torch.distributed as dist
    text = str(e).lower()
    return isinstance(e, dist.DistError) or any(w in text for w in ("gloo", "nccl", "connection reset", "timed out"))


def run_worker(cfg: Config, run_dir: str, on_record=None, says_refusals: bool = True) -> None:
    """`on_record`: called on every rank with each metrics record as it is logged (the Ray engine reports them).
    `says_refusals`: rank 0 prints the `error:` line of a checkpoint it refuses as it loads it (a worker that
    the launcher spawned leaves that line to the launcher, which prints it once whichever rank refused).
    The admitted config is read, never edited: any write raises (spawned and Ray workers rebuild it from YAML)."""
    OmegaConf.set_readonly(cfg, True)
    set_storage_timeout(cfg.checkpoint.storage_timeout_s)
    with determinism.applied(cfg):
        _run(cfg, run_dir, on_record, says_refusals)


def _run(cfg: Config, run_dir: str, on_record, says_refusals: bool) -> None:
    strategy = strategy_runtime(cfg.parallel.name)(cfg)
    strategy.setup_distributed()
    try:
        Trainer(cfg, strategy, run_dir, on_record).fit()
    except Preempted as e:
        strategy.teardown()
        saved = storage.isfile(storage.join(checkpoint_dir(cfg, run_dir), step_dir_name(e.step), META))
        if strategy.is_main:
            print(f"preempted: {e}; the checkpoint is saved, exit {exit_codes.REQUEUE} asks for a requeue "
                  f"(run again with checkpoint.resume=auto)" if saved else
                  f"preempted: {e}; no checkpoint saved (checkpoint.enabled=false): nothing to resume from",
                  file=sys.stderr)
        if saved:
            report_requeue(strategy.rank)
        pass_on(e.signum)
        sys.exit(exit_codes.REQUEUE if saved else 1)
    except TrackerError as e:
        # rank 0 alone: a tracker that did not start (logging.tracker_errors=fail). One line, and out at once: the
        # other ranks wait in a collective that the launcher ends when it sees this one go.
        ErrorHandler().record_exception(e)
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except ResumeRefused as e:
        # A rank that read a file it refused (DeepSpeed: its own optimizer partition, which its peers never read)
        # exits at once: the peers may be waiting for it in a collective, and teardown would wait for them.
        ErrorHandler().record_exception(e)
        if strategy.is_main and says_refusals:
            print(f"error: {REFUSED_RESUME}: {e}", file=sys.stderr, flush=True)
        sys.exit(exit_codes.USAGE)
    except (GpuFault, OutOfMemoryAtOneSequence) as e:
        # every rank read the same gathered counts, or the same agreed report, and stopped at the same step.
        # Each records it for the launcher first: the first rank to exit gets its peers killed, the main one too.
        ErrorHandler().record_exception(e)
        code = exit_codes.GPU_FAULT if isinstance(e, GpuFault) else 1
        if strategy.is_main:
            print(f"error: {'GPU fault: ' if code == exit_codes.GPU_FAULT else ''}{e}", file=sys.stderr, flush=True)
        strategy.teardown()
        sys.exit(code)
    # Only after success: teardown synchronises all ranks, and a rank that raised must exit at once
    # (its peers may be blocked in a collective) so the elastic agent sees the failure and stops the group.
    strategy.teardown()


def die_with_launcher(launcher_pid: int) -> None:
    """A spawned worker must not outlive its launcher, even one killed with SIGKILL (no handler runs). Its parent is
    the launcher's fork server, which multiprocessing keeps alive while any process holds the write end of its
    keep-alive pipe, and every worker holds one: so the worker watches the launcher itself, through a pidfd (Linux
    5.3+), and leaves the moment it ends; prctl(PR_SET_PDEATHSIG) takes it too should the fork server go first."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        watched = os.pidfd_open(launcher_pid)
    except ProcessLookupError:          # it died before the watch began
        os._exit(1)
    except (OSError, AttributeError):   # not Linux: the launcher's signal handlers still stop us
        return
    if launcher_pid not in (os.getppid(), _parent_of(os.getppid())):   # its pid is another process's by now
        os._exit(1)
    threading.Thread(target=_exit_when_readable, args=(watched,), name="launcher-watch", daemon=True).start()


def _exit_when_readable(pidfd: int) -> None:
    """A pidfd turns readable when its process ends."""
    select.select([pidfd], [], [])
    os._exit(1)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@record
def _recorded_worker(run_dir: str, config_yaml: str, launcher_pid: int) -> None:
    cfg = OmegaConf.create(config_yaml)
    for number in map(signal_number, cfg.launcher.preempt_signals):
        if number is not None:    # the fork server ignores them (launch.torch.start_fork_server) and so did we
            signal.signal(number, signal.SIG_DFL)
    # Ctrl-C, passed on by the launcher, ends a worker at once, even one blocked in a collective whose peer
    # is gone (Python's KeyboardInterrupt waits for the call to return: the launcher then waited the whole
    # launcher.stop_grace_s, 180 s, before its SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_launcher(launcher_pid)
    run_worker(cfg, run_dir, says_refusals=False)


def worker_entry(run_dir: str, config_yaml: str, launcher_pid: int) -> None:
    """Entry point of a spawned worker: the resolved config the parent validated."""
    try:
        _recorded_worker(run_dir, config_yaml, launcher_pid)
    except SystemExit:
        raise
    except BaseException as e:
        # `record` has written the error file. A normal interpreter exit would now run the C++ destructors
        # of a process group whose peers are gone, and gloo can abort there (SIGABRT), hiding the error.
        traceback.print_exc()
        if _peer_failure(e):
            # The elastic agent reports the first dead worker it finds: give it time to find the peer
            # that died (the cause) before this rank, which only noticed it, exits too.
            time.sleep(PEER_FAILURE_GRACE_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
