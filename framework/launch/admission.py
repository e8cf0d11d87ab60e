"""Admit (derive, then validate), then hand the job to its engine (launcher.engine, framework.runtime.engines):
torch's (workers in this process or spawned here: framework.launch.torch) or Ray's (framework.launch.ray).

Admission happens here, before any worker or process group exists: `admit` is the one ordered list of what is
derived (each derivation a named function here, the only writes into the job's config) and then checked. Spawned
workers do not compose the config again: they get the resolved config the parent admitted (and wrote to the run dir).
"""
from __future__ import annotations

import os
import shutil
import sys
from datetime import timedelta

from omegaconf import DictConfig, OmegaConf

from framework import exit_codes
from framework.checkpoint.resume import completed_checkpoint
from framework.config.derive import derive
from framework.config.explicit import hydra_explicit_keys
from framework.config.validate import validate
from framework.data.resolve import apply_dataset_manifests, given_on_command_line
from framework.errors import ConfigError
from framework.launch import sweep_gpus
from framework.metrics import trackers
from framework.metrics.logger import final_value
from framework.redact import redacted, redacted_yaml
from framework.runtime.cluster_env import discover, stable_job_dir
from framework.runtime.engines import engine_class
from framework.runtime.world import spawned_workers, under_torchrun, world_size_for
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
    user gave torchrun, ...: framework.runtime.cluster_env.stable_job_dir) every rank and every attempt derives
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
    """Everything decided before any worker exists, in this one order: the derivations, each a named function
    (below, and framework/config/derive.py's once the world is known) and the only writes into cfg, so that
    config.yaml shows what ran; then cfg is read-only, and the checks read it: every validation rule, the memory
    plan and the engine's own checks. The trackers' probe, the one derivation that waits on the network, comes after
    the rules and the plan, so a job they refuse is refused at once. Returns (strategy class, world size, engine);
    raises ConfigError (or trackers.TrackerError)."""
    derive_sweep_gpus(cfg)             # before any device count: a concurrent sweep point's own GPUs
    derive_auto_layout(cfg)
    strategy_cls = strategy_class(cfg.parallel.name)
    derive_dataset_facts(cfg)
    world_size = world_size_for(cfg, strategy_cls)
    explicit = hydra_explicit_keys() if explicit is None else explicit
    derive(cfg, world_size, strategy_cls, explicit)
    logs = run_dir is not None and is_rank_zero()       # the rank that logs: it must reach the trackers
    if logs:
        derive_run_name(cfg, run_dir)
    OmegaConf.set_readonly(cfg, True)
    validate(cfg, world_size, strategy_cls, run_dir, explicit)
    check_the_plan(cfg, world_size)
    if logs:        # the one derivation that waits on the network: after every rule that reads the config alone
        OmegaConf.set_readonly(cfg, False)
        derive_tracker_names(cfg)
        OmegaConf.set_readonly(cfg, True)     # admitted: from here on the config is read, never edited
    engine = engine_class(cfg.launcher.engine)(cfg, strategy_cls, world_size)
    engine.check()
    return strategy_cls, world_size, engine


def derive_sweep_gpus(cfg: DictConfig) -> None:
    """Under a Hydra multirun on CUDA: this sweep point's own GPUs (CUDA_VISIBLE_DEVICES)."""
    sweep_gpus.for_this_point(cfg)


def derive_auto_layout(cfg: DictConfig) -> None:
    if cfg.parallel.name == "auto":
        choose_auto_layout(cfg)


def derive_dataset_facts(cfg: DictConfig) -> None:
    """A prepared dataset's vocabulary, EOS id and tokenizer (a source that tokenizes at launch prepares it here)."""
    apply_dataset_manifests(cfg, model_vocab_given=given_on_command_line("model.vocab_size"))


def derive_run_name(cfg: DictConfig, run_dir: str) -> None:
    cfg.logging.run_name = cfg.logging.run_name or trackers.default_run_name(run_dir)


def derive_tracker_names(cfg: DictConfig) -> None:
    """The chosen trackers that answer (with logging.tracker_errors=warn the others are dropped)."""
    trackers.probe(cfg)


def run(cfg: DictConfig, run_dir: str) -> float | None:
    """Admit, then train; return the final trainer.objective (on rank 0), exit 2 on a configuration error."""
    try:
        strategy_cls, world_size, engine = admit(cfg, run_dir)
    except trackers.TrackerError as e:
        print(f"error: logging.trackers: {redacted(str(e))}", file=sys.stderr)
        remove_if_only_hydra_files(run_dir)
        sys.exit(exit_codes.USAGE)
    except ConfigError as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        remove_if_only_hydra_files(run_dir)
        sys.exit(exit_codes.USAGE)

    engine.prepare()
    if (finished := completed_checkpoint(cfg, run_dir)) is not None:
        if is_rank_zero():
            print(f"already complete: {finished} is at trainer.max_steps={cfg.trainer.max_steps}; nothing to do")
        return

    if is_rank_zero():
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, RESOLVED_CONFIG), "w", encoding="utf-8") as f:
            f.write(redacted_yaml(cfg))
    engine.run(run_dir)
    return final_value(run_dir, cfg.trainer.objective) if is_rank_zero() else None


def choose_auto_layout(cfg: DictConfig) -> None:
    """parallel=auto: the planner's fastest layout for this world and device replaces cfg.parallel (and
    zero, activation checkpointing, micro-batch), so the resolved config.yaml holds the layout that ran."""
    from framework.plan.auto import choose_layout
    from framework.plan.check import gpus_per_node, planned_device
    from framework.plan.hardware import measured_cpu
    device = planned_device(cfg) or measured_cpu()
    world = world_size_for(cfg, None)
    text, _ = choose_layout(cfg, world, device, gpus_per_node(cfg, world, device))
    if is_rank_zero():
        print(text, file=sys.stderr)
    # the picked strategy would spawn its own default number of workers, not the world it was planned for
    if cfg.launcher.nproc_per_node is None and not under_torchrun() and discover(os.environ) is None \
            and spawned_workers(cfg, strategy_class(cfg.parallel.name)) != world:
        cfg.launcher.nproc_per_node = world


def _derived_and_valid(trial: DictConfig, world_size: int) -> None:
    """The planner's trial copy of the job's config: derived (into the copy) and validated as the job was."""
    strategy_cls = strategy_class(trial.parallel.name)
    derive(trial, world_size, strategy_cls)
    validate(trial, world_size, strategy_cls)


def check_the_plan(cfg: DictConfig, world_size: int) -> None:
    """Refuse a job the planner says cannot fit its device (a GPU, or planner.device)."""
    from framework.plan.check import refuse_if_it_cannot_fit
    try:
        refuse_if_it_cannot_fit(cfg, world_size, lambda trial: _derived_and_valid(trial, world_size))
    except ConfigError:
        raise
    except Exception as e:      # a model the planner cannot trace must not stop a job that may well fit
        if is_rank_zero():
            print(f"warning: no memory plan ({type(e).__name__}: {e}); planner.check=false hides this",
                  file=sys.stderr)
