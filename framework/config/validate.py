"""Who checks what, in order: the launching process runs these before any worker or process group exists. The
rules live with their owners (the model's and LoRA's in models/rules.py, the data's in data/rules.py, the
reports' in metrics/rules.py, the checkpoints' in checkpoint/rules.py, a strategy's in its traits'
`validate`); here are their order and the generic key checks.

Each rule raises ConfigError(key, message) with the numbers involved and what would work. No rule writes: the
values derived from others are filled in before (derive.py), and admission hands validation a read-only config.
"""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from framework.checkpoint.rules import validate_checkpoint
from framework.config.batch_changes import validate_batch_changes
from framework.config.choices import check_choices
from framework.config.explicit import hydra_explicit_keys
from framework.config.unknown_keys import refuse_unknown_keys
from framework.data.rules import validate_data_contents, validate_data_files
from framework.errors import ConfigError, require_positive
from framework.evaluation.rules import validate_eval
from framework.metrics.rules import validate_logging, validate_profile, validate_sampling
from framework.models.rules import importable, validate_lora, validate_model
from framework.models.spec import spec_for
from framework.objectives.rules import validate_objective
from framework.optim.rules import validate_optimizer, validate_optimizer_extra
from framework.parallel.activation_checkpointing import check_mode as check_ac_mode
from framework.runtime import determinism
from framework.runtime.devices import check_visible_gpus
from framework.runtime.engines import workers_here
from framework.runtime.preemption import signal_number

if TYPE_CHECKING:
    from framework.config.schema import Config


def _select(cfg: Config, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _module_exists(name: str) -> bool:
    """Whether `name` is a module (finding a submodule imports its parents; the fork server would anyway)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_keys(cfg: Config) -> None:
    """The generic key checks: no unknown key, none missing, every group's choice one it has. They come first in
    admission too: the derivations (derive.py) read complete, known keys."""
    refuse_unknown_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(missing[0], f"is required; set it on the command line, e.g. {missing[0]}=...")
    check_choices(cfg)


def validate(cfg: Config, world_size: int, strategy_cls, run_dir: str | None = None,
             explicit: set[str] | None = None) -> None:
    """Checks every rule on a config whose derived values are filled in: framework.config.derive ran first (it
    checks the keys, the world and the batch layout the derivations read, so they are not checked twice); reads
    it only (admission hands it over read-only)."""
    explicit = hydra_explicit_keys() if explicit is None else explicit
    require_positive(cfg, "trainer.max_steps", "trainer.log_every", "optimizer.lr", "checkpoint.keep_last",
                     "launcher.timeout_s", "launcher.stop_grace_s")
    for key in ("trainer.eval_every", "trainer.grad_clip", "checkpoint.interval", "launcher.max_restarts",
                "scheduler.warmup_steps", "seed", "trainer.stall_timeout_s"):
        if _select(cfg, key) < 0:
            raise ConfigError(key, f"must not be negative, got {_select(cfg, key)}")
    if cfg.launcher.nproc_per_node is not None and cfg.launcher.nproc_per_node <= 0:
        raise ConfigError("launcher.nproc_per_node", f"must be positive, got {cfg.launcher.nproc_per_node}")
    for name in cfg.launcher.preempt_signals:
        if signal_number(name) is None or name in ("SIGKILL", "SIGSTOP"):
            raise ConfigError("launcher.preempt_signals", f"{name!r} is not a signal a process can handle; "
                                                          f"use names such as SIGTERM, SIGUSR1, SIGUSR2")
    for name in cfg.launcher.preload:
        if not _module_exists(name):
            raise ConfigError("launcher.preload", f"{name!r} is not a module this Python can import")
    if not 0 <= cfg.scheduler.min_lr_ratio <= 1:
        raise ConfigError("scheduler.min_lr_ratio", f"must be in [0, 1], got {cfg.scheduler.min_lr_ratio}")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "device=cuda but no CUDA device is visible; use device=cpu or auto")
    if workers_here(cfg):      # Ray places its workers on the cluster's GPUs, not this host's
        check_visible_gpus(cfg, world_size)
    if cfg.zero.stage not in (0, 1, 2, 3):
        raise ConfigError("zero.stage", f"must be 0-3, got {cfg.zero.stage}")
    check_ac_mode(cfg.activation_checkpointing)
    validate_data_files(cfg, explicit)
    validate_sampling(cfg)
    validate_logging(cfg)
    validate_profile(cfg)
    validate_eval(cfg)
    validate_checkpoint(cfg, strategy_cls, run_dir)
    determinism.validate(cfg, strategy_cls)
    validate_model(cfg)
    validate_optimizer_extra(cfg)
    validate_optimizer(cfg, importable("optimizer._target_", cfg.optimizer._target_), strategy_cls,
                       lambda: spec_for(cfg.model).meta_skeleton(cfg.model))
    validate_lora(cfg)
    validate_objective(cfg, strategy_cls.frozen_reference, strategy_cls.name)
    strategy_cls.validate(cfg, world_size)
    validate_batch_changes(cfg, strategy_cls, world_size)
    validate_data_contents(cfg)
