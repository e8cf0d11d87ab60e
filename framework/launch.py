"""Where the job runs: in this process, in workers spawned through torch's elastic launcher,
or as one worker of an outer torchrun, SLURM step or Kubeflow pod (framework.cluster.env says which).

Validation happens here, before any worker or process group exists. Spawned workers do not
compose the config again: they get the resolved config the parent validated (and wrote to the run dir).
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import time
import uuid
from datetime import timedelta

from omegaconf import DictConfig, OmegaConf

from framework import exit_codes
from framework import sweep_gpus
from framework.cluster.env import Node, Worker, discover, stable_job_dir
from framework.checkpoint.manager import (META, CheckpointError, checkpoint_dir, complete_checkpoints,
                                          completed_checkpoint, read_meta)
from framework.errors import ConfigError
from framework.config.validate import validate
from framework.data.resolve import apply_dataset_manifests, given_on_command_line
from framework.world import nproc_for_node, under_torchrun, world_size_for
from framework.metrics.logger import final_value
from framework.preemption import ignoring, stopping_once_on
from framework.strategies.registry import strategy_class

RESOLVED_CONFIG = "config.yaml"


def is_rank_zero() -> bool:
    placement = discover(os.environ)
    if placement is not None:
        return placement.is_rank_zero
    return int(os.environ.get("RANK", "0")) == 0


def agree_run_dir(candidate: str) -> str:
    """The default run dir (no hydra.run.dir given): every rank must use the same one, and a requeued
    job must find its own again. Where the launcher names the job (SLURM's job id, a rendezvous id the
    user gave torchrun, ...: framework.cluster.env.stable_job_dir) every rank and every attempt derives
    the same dir from it.

    Otherwise, under torchrun, its agent hosts a key-value store that every worker reaches at
    MASTER_ADDR:MASTER_PORT. Rank 0 publishes its run dir there (keeping an earlier one after an elastic
    restart, so a restarted group resumes in the same dir); the others wait for it.
    """
    if (stable := stable_job_dir(os.environ)) is not None:
        return stable
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


def remove_if_only_hydra_files(run_dir: str) -> None:
    """Hydra makes the run dir before the job starts; a rejected config should leave nothing behind."""
    if is_rank_zero() and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= {".hydra"}:
        shutil.rmtree(run_dir, ignore_errors=True)


def admit(cfg: DictConfig, run_dir: str | None = None, explicit: set[str] | None = None):
    """Everything decided before any worker exists, in order: the layout (parallel=auto's pick), the
    strategy, the dataset's own facts, the world size, every validation rule and the memory plan. Completes
    cfg with what it derives; returns (strategy class, world size); raises ConfigError."""
    sweep_gpus.for_this_point(cfg)     # before any device count: a concurrent sweep point's own GPUs
    if cfg.parallel.name == "auto":
        choose_auto_layout(cfg)
    strategy_cls = strategy_class(cfg.parallel.name)
    apply_dataset_manifests(cfg, model_vocab_given=given_on_command_line("model.vocab_size"))
    world_size = world_size_for(cfg, strategy_cls)
    validate(cfg, world_size, strategy_cls, run_dir, explicit)
    check_the_plan(cfg, world_size)
    return strategy_cls, world_size


def run(cfg: DictConfig, run_dir: str) -> float | None:
    """Validate, then train; return the final trainer.objective (on rank 0), exit 2 on a configuration error."""
    try:
        strategy_cls, world_size = admit(cfg, run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        remove_if_only_hydra_files(run_dir)
        sys.exit(exit_codes.USAGE)

    placement = discover(os.environ)
    spawns = not (under_torchrun() or isinstance(placement, Worker) or world_size == 1)
    if spawns:
        start_fork_server(strategy_cls.worker_preload(cfg), cfg.launcher.preempt_signals)
    if (finished := completed_checkpoint(cfg, run_dir)) is not None:
        if is_rank_zero():
            print(f"already complete: {finished} is at trainer.max_steps={cfg.trainer.max_steps}; nothing to do")
        return

    if is_rank_zero():
        os.makedirs(run_dir, exist_ok=True)
        OmegaConf.save(cfg, os.path.join(run_dir, RESOLVED_CONFIG), resolve=True)

    if spawns:
        spawn_workers(cfg, nproc_for_node(cfg, strategy_cls, placement), run_dir, placement)
    else:
        from framework.worker import run_worker
        if isinstance(placement, Worker):
            os.environ.update(placement.torch_env())
        run_worker(cfg, run_dir)
    return final_value(run_dir, cfg.trainer.objective) if is_rank_zero() else None


def choose_auto_layout(cfg: DictConfig) -> None:
    """parallel=auto: the planner's fastest layout for this world and device replaces cfg.parallel (and
    zero, activation checkpointing, micro-batch), so the resolved config.yaml holds the layout that ran."""
    from framework.plan.auto import choose_layout
    from framework.plan.check import planned_device
    from framework.plan.hardware import measured_cpu
    device = planned_device(cfg) or measured_cpu()
    world = world_size_for(cfg, None)
    per_node = cfg.planner.gpus_per_node or (world if device.name == "cpu" else 8)
    text, _ = choose_layout(cfg, world, device, per_node)
    if is_rank_zero():
        print(text, file=sys.stderr)
    if cfg.parallel.name in ("fsdp", "3d", "deepspeed") and cfg.launcher.nproc_per_node is None \
            and not under_torchrun() and discover(os.environ) is None:
        cfg.launcher.nproc_per_node = world


def check_the_plan(cfg: DictConfig, world_size: int) -> None:
    """Refuse a job the planner says cannot fit its device (a GPU, or planner.device)."""
    from framework.plan.check import refuse_if_it_cannot_fit
    try:
        refuse_if_it_cannot_fit(cfg, world_size, lambda c: validate(c, world_size, strategy_class(c.parallel.name)))
    except ConfigError:
        raise
    except Exception as e:      # a model the planner cannot trace must not stop a job that may well fit
        if is_rank_zero():
            print(f"warning: no memory plan ({type(e).__name__}: {e}); planner.check=false hides this",
                  file=sys.stderr)


def start_fork_server(strategy_modules: tuple[str, ...] = (), preempt_signals=()) -> None:
    """Workers fork from one server process that imported torch, the trainer and what the strategy's
    workers use once; spawned workers each imported them again (3 s of CPU a worker: an 8-worker job on
    2 cores started ~20 s later). Started as soon as the job is known to spawn workers, its imports
    overlap the launcher's own. A server already running (an earlier job of a sweep) is kept.

    The server (and multiprocessing's resource tracker, started with it) ignores the preemption signals:
    SLURM and `timeout` signal the whole process group, and a server killed by them took its children, the
    workers, with it (their parent-death signal) before they could save. Workers restore the defaults."""
    from multiprocessing import forkserver
    # torch._dynamo too: DDP and FSDP import it on their first wrap, ~1 s of CPU in each worker
    multiprocessing.set_forkserver_preload(["framework.worker", "torch._dynamo", *strategy_modules,
                                            "framework.fork_server_exit"])
    with ignoring(preempt_signals):
        forkserver.ensure_running()


def checkpoint_of_last_step(cfg: DictConfig, run_dir: str, since: float) -> str | None:
    """The newest complete checkpoint if it was completed after `since` (this launch: not one an earlier
    attempt left) and is of the last step the job logged: what the workers saved on a preemption signal,
    and what a requeued job resumes from. (Not the time of the launcher's signal: on a busy host the
    workers, signalled directly, can save before the launcher's handler runs.)"""
    found = complete_checkpoints(checkpoint_dir(cfg, run_dir))
    if not found or os.path.getmtime(os.path.join(found[-1], META)) < since:
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

    from framework.worker import worker_entry

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
        attempts = cfg.launcher.max_restarts + 1
        print(f"error: worker rank {rank} {describe_failure(failure)} "
              f"({attempts} attempt{'s' if attempts > 1 else ''}, launcher.max_restarts={cfg.launcher.max_restarts})",
              file=sys.stderr)
        sys.exit(1)


def describe_failure(failure) -> str:
    """How a worker died, in a few words: a signal, a stall, or the exception it recorded."""
    from framework.watchdog import STALL_DIR
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    if failure.exitcode == exit_codes.STALL:
        return f"stalled (trainer.stall_timeout_s; stacks in <run dir>/{STALL_DIR}/)"
    message = failure.message.get("message") if isinstance(failure.message, dict) else failure.message
    first_line = (message or "").strip().splitlines()[-1:] or ["see its output above"]
    return f"failed with exit code {failure.exitcode}: {first_line[0]}"
