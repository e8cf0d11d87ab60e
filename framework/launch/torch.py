"""launcher.engine=torch: the workers are this process (one of torchrun's, a SLURM step's task, a Kubeflow pod's
process: framework.runtime.cluster_env says which), or spawned on this host through torch's elastic launcher, which
restarts the group (launcher.max_restarts) and meets other nodes at a rendezvous."""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys
import time
import uuid
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from framework import exit_codes, storage
from framework.checkpoint.names import META, CheckpointError, checkpoint_dir, complete_checkpoints, read_meta
from framework.launch.base import Engine
from framework.launch.preload import FORK_SERVER_PRELOAD, fork_server_preload
from framework.redact import redacted
from framework.runtime.cluster_env import Node, Worker, discover
from framework.runtime.preemption import ignoring, stopping_once_on
from framework.runtime.world import nproc_for_node, under_torchrun

if TYPE_CHECKING:
    from framework.config.schema import Config


class TorchEngine(Engine):
    def __init__(self, cfg: Config, strategy_cls, world_size: int):
        super().__init__(cfg, strategy_cls, world_size)
        self.placement = discover(os.environ)
        self.spawns = not (under_torchrun() or isinstance(self.placement, Worker) or world_size == 1)

    def prepare(self) -> None:
        if self.spawns:
            start_fork_server((*fork_server_preload(self.strategy_cls, self.cfg), *self.cfg.launcher.preload),
                              self.cfg.launcher.preempt_signals)

    def run(self, run_dir: str) -> None:
        if self.spawns:
            spawn_workers(self.cfg, nproc_for_node(self.cfg, self.strategy_cls, self.placement), run_dir,
                          self.placement)
            return
        from framework.train.worker import run_worker
        environ = dict(os.environ)
        try:
            if isinstance(self.placement, Worker):
                os.environ.update(self.placement.torch_env())
            run_worker(self.cfg, run_dir)
        finally:
            # the next point of a sweep must not find this job's world (join_one_process_world's WORLD_SIZE=1
            # made a later 4-rank point a rank of a world of one)
            os.environ.clear()
            os.environ.update(environ)


def start_fork_server(worker_modules: tuple[str, ...] = (), preempt_signals=()) -> None:
    """Workers fork from one server process that imported torch, the trainer and what this job's workers use
    once; spawned workers each imported them again (3 s of CPU a worker: an 8-worker job on 2 cores started
    ~20 s later). Started as soon as the job is known to spawn workers, its imports overlap the launcher's
    own. The server a process started first serves its later jobs too (a sweep's points): their workers import
    what it did not preload themselves (replacing a running server needs multiprocessing's private internals),
    and a sweep that mixes strategies can name their union in launcher.preload. framework.launch.fork_server_exit comes
    last: the server then leaves without tearing its modules down.

    The server (and multiprocessing's resource tracker, started with it) ignores the preemption signals:
    SLURM and `timeout` signal the whole process group, and a server killed by them took its children, the
    workers, with it (their parent-death signal) before they could save. Workers restore the defaults."""
    from multiprocessing import forkserver
    multiprocessing.set_forkserver_preload([*dict.fromkeys([*FORK_SERVER_PRELOAD, *worker_modules]),
                                            "framework.launch.fork_server_exit"])
    with ignoring(preempt_signals):
        forkserver.ensure_running()


def checkpoint_of_last_step(cfg: DictConfig, run_dir: str, since: float) -> str | None:
    """The newest complete checkpoint if it was completed after `since` (this launch: not one an earlier
    attempt left) and is of the last step the job logged: what the workers saved on a preemption signal,
    and what a requeued job resumes from. (Not the time of the launcher's signal: on a busy host the
    workers, signalled directly, can save before the launcher's handler runs.)"""
    found = complete_checkpoints(checkpoint_dir(cfg, run_dir))
    if not found or storage.modified(storage.join(found[-1], META)) < since:
        return None
    try:
        step = int(read_meta(found[-1])["step"])
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            lines = [line for line in f if line.strip()]
        last_logged = json.loads(lines[-1])["step"] if lines else 0
    except (CheckpointError, KeyError, ValueError, OSError):
        return None
    return found[-1] if step >= last_logged else None


def stopped_by_preemption(cfg: DictConfig, run_dir: str, name: str, since: float) -> None:
    """Exit REQUEUE where the workers saved a checkpoint of their last step, else say what happened."""
    if (saved := checkpoint_of_last_step(cfg, run_dir, since)) is not None:
        print(f"stopped by {name} after a checkpoint ({saved}); exit {exit_codes.REQUEUE} asks to be requeued "
              f"(checkpoint.resume=auto continues)", file=sys.stderr)
        sys.exit(exit_codes.REQUEUE)
    why = ("checkpoint.enabled=false" if not cfg.checkpoint.enabled
           else "the workers stopped before their save completed; see their output above")
    print(f"error: stopped by {name} without a checkpoint of the last step ({why})", file=sys.stderr)
    sys.exit(1)


def agent_options(cfg: DictConfig) -> dict:
    """LaunchConfig settings that differ between torch releases, in one place: the signals torch's agent
    handles itself (all but the preemption signals, which are ours: stopping_once_on), and its grace
    between passing a signal on and SIGKILLing the workers (launcher.stop_grace_s; torch's default is 30 s).
    An older agent reads the signals from TORCHELASTIC_SIGNALS_TO_HANDLE and has no grace setting."""
    from dataclasses import fields

    from torch.distributed.launcher.api import LaunchConfig
    known = {f.name for f in fields(LaunchConfig)}
    agent_signals = ",".join(s for s in ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]
                             if s not in cfg.launcher.preempt_signals)
    options = {}
    if "signals_to_handle" in known:
        options["signals_to_handle"] = agent_signals
    else:
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = agent_signals
    if "shutdown_timeout" in known:
        options["shutdown_timeout"] = int(math.ceil(cfg.launcher.stop_grace_s))
    else:
        print(f"warning: launcher.stop_grace_s={cfg.launcher.stop_grace_s} needs a torch whose elastic launcher "
              f"has shutdown_timeout; this one SIGKILLs workers 30 s after passing a signal on", file=sys.stderr)
    return options


def spawn_workers(cfg: DictConfig, nproc: int, run_dir: str, node: Node | None = None) -> None:
    """nproc workers on this host; with `node`, this host's share of a multi-node group that meets at
    the node's rendezvous (static: ranks follow the node rank; c10d: nodes join in any order)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from framework.train.worker import REFUSED_RESUME, worker_entry

    rendezvous = dict(min_nodes=1, max_nodes=1, run_id=f"framework-{uuid.uuid4().hex[:8]}",
                      rdzv_backend="c10d", rdzv_endpoint="localhost:0")
    if node is not None:
        rendezvous = dict(min_nodes=node.min_nodes, max_nodes=node.max_nodes,
                          run_id=node.job_id or f"framework-{node.master_port}", rdzv_backend=node.rdzv_backend,
                          rdzv_endpoint=f"{node.master_addr}:{node.master_port}",
                          rdzv_configs={"rank": node.node_rank} if node.rdzv_backend == "static" else {})
    if rendezvous["min_nodes"] < rendezvous["max_nodes"]:
        # A node joining a running group: with the rendezvous store shared across rounds, torch's agent on
        # the old rank-0 node never publishes the new round's master address, and both sides wait on the
        # store until they time out. Each round then gets its own store.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The agent passes the signals it handles on to the workers and stops them; the preemption signals
    # are ours (stopping_once_on), passed on the same way, and the workers checkpoint and exit REQUEUE.
    preempt = list(cfg.launcher.preempt_signals)
    config = LaunchConfig(
        nproc_per_node=nproc, **rendezvous,
        max_restarts=cfg.launcher.max_restarts,
        monitor_interval=cfg.launcher.monitor_interval,
        start_method="forkserver",
        **agent_options(cfg),
    )
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        # a joblib (loky) sweep worker: its children could not set up loky's start method
        multiprocessing.set_start_method("spawn", force=True)
    started = time.time()
    try:
        with stopping_once_on(preempt):
            # The resolved config travels with the call: other nodes may not see rank 0's run dir yet.
            elastic_launch(config, worker_entry)(os.path.abspath(run_dir), OmegaConf.to_yaml(cfg, resolve=True),
                                                 os.getpid())
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        if name in preempt:
            stopped_by_preemption(cfg, run_dir, name, started)
        print(f"error: stopped by {name}; workers stopped", file=sys.stderr)
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode == exit_codes.REQUEUE:     # the signal reached the workers only
            stopped_by_preemption(cfg, run_dir, "a preemption signal to the workers", started)
        if failure.exitcode == exit_codes.USAGE:       # a checkpoint a worker refused as it read it
            print(f"error: {REFUSED_RESUME}: {recorded_message(failure)}", file=sys.stderr)
            sys.exit(exit_codes.USAGE)
        attempts = cfg.launcher.max_restarts + 1
        print(f"error: worker rank {rank} {redacted(describe_failure(failure))} "
              f"({attempts} attempt{'s' if attempts > 1 else ''}, launcher.max_restarts={cfg.launcher.max_restarts})",
              file=sys.stderr)
        sys.exit(exit_codes.GPU_FAULT if failure.exitcode == exit_codes.GPU_FAULT else 1)


def recorded_message(failure) -> str:
    """The message of the exception a worker recorded, less its type ("ResumeRefused: ...")."""
    message = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
    return (message or "").strip().partition(": ")[2] or "see its output above"


def describe_failure(failure) -> str:
    """How a worker died, in a few words: a signal, a stall, or the exception it recorded."""
    from framework.runtime.watchdog import STALL_DIR
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    if failure.exitcode == exit_codes.STALL:
        return f"stalled (trainer.stall_timeout_s; stacks in <run dir>/{STALL_DIR}/)"
    message = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
    if failure.exitcode == exit_codes.GPU_FAULT:
        recorded = (message or "").partition(": ")[2]      # the worker recorded "GpuFault: rank ..."
        return f"stopped on a GPU fault: {recorded}" if recorded.startswith("rank ") else \
            "stopped on a GPU fault (host and GPU named above): restart without that node"
    first_line = (message or "").strip().splitlines()[-1:] or ["see its output above"]
    return f"failed with exit code {failure.exitcode}: {first_line[0]}"
