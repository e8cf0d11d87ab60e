"""Cross-field rules, checked in the launching process before any worker or process group exists.

Each rule raises ConfigError(key, message) with the numbers involved and what would work.
"""
from __future__ import annotations

import glob
import os

import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from framework.checkpoint.manager import (RNG, STATE, CheckpointError, check_compatible,
                                         resolve_resume)
from framework.checkpoint.safety import (UnsafeCheckpointError, check_dcp_metadata, check_deepspeed_files,
                                         load_tensors_only)
from framework.config.errors import ConfigError
from framework.data.sources import TOKEN_DTYPES, DataError, check_token_range, load_tokens
from framework.models import hf_files
from framework.models.spec import spec_for
from framework.optim.schedulers import SCHEDULES

EXAMPLE_TARGET = "framework.models.llama.Llama"


def _positive(cfg, *keys: str) -> None:
    for key in keys:
        node, _, leaf = key.rpartition(".")
        value = getattr(_select(cfg, node), leaf)
        if value is None or value <= 0:
            raise ConfigError(key, f"must be positive, got {value}")


def _select(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _importable(key: str, target: str) -> type:
    try:
        return get_class(target)
    except Exception:
        raise ConfigError(key, f"cannot import {target!r}; give a class path such as {EXAMPLE_TARGET}") from None


def validate_model(cfg) -> None:
    model = cfg.model
    if "_target_" not in model or not model._target_:
        raise ConfigError("model._target_", "missing: name the nn.Module class to train")
    _importable("model._target_", model._target_)
    spec_for(model).validate(cfg)


def validate_data_files(cfg) -> None:
    data = cfg.data
    _positive(cfg, "data.seq_len", "data.vocab_size")
    if not 0 <= data.val_fraction < 1:
        raise ConfigError("data.val_fraction", f"must be in [0, 1), got {data.val_fraction}")
    if data.source in ("text", "tokens"):
        if not data.path:
            raise ConfigError("data.path", f"is required for data.source={data.source}; "
                                           f"set data.path=/path/to/file")
        if not os.path.isfile(data.path):
            raise ConfigError("data.path", f"no such file: {data.path}")
        if data.source == "tokens" and data.dtype not in TOKEN_DTYPES:
            raise ConfigError("data.dtype", f"unknown token dtype {data.dtype!r}; use uint16 or uint32")
    elif data.source not in ("pydoc", "synthetic"):
        raise ConfigError("data.source", f"unknown source {data.source!r}; use pydoc, text, tokens or synthetic")


def validate_data_contents(cfg) -> None:
    """Reads the data (a memmap for token files): the last check, after the cheap ones passed."""
    data = cfg.data
    try:
        tokens = load_tokens(data)
        check_token_range(tokens, data.vocab_size, data.path)
    except DataError as e:
        key, _, msg = str(e).partition(": ")
        raise ConfigError(key, msg) from None
    train_tokens = len(tokens) - int(len(tokens) * data.val_fraction)
    if train_tokens < data.seq_len + 1:
        raise ConfigError("data.seq_len", f"the training split holds {train_tokens} tokens, "
                                          f"fewer than one sequence of {data.seq_len + 1}")
    if cfg.trainer.eval_every and int(len(tokens) * data.val_fraction) < data.seq_len + 1:
        raise ConfigError("trainer.eval_every", "evaluation needs a validation split of at least one sequence; "
                                                "raise data.val_fraction or set trainer.eval_every=0")


def validate_initial_load(cfg, path: str) -> None:
    """The HF-layout weights must fit cfg.model exactly: config.json's shapes and every tensor's."""
    key = "checkpoint.initial_load"
    _importable("model._target_", cfg.model._target_)
    spec = spec_for(cfg.model)
    if not spec.has_hf_layout:
        raise ConfigError(key, f"loads Hugging Face weights into models with an HF layout (llama), not "
                               f"{cfg.model.get('_target_')} (model spec {spec.name})")
    for name in (hf_files.CONFIG, hf_files.WEIGHTS):
        if not os.path.isfile(os.path.join(path, name)):
            raise ConfigError(key, f"{path} has no {name}; write one with `python -m framework.export`")
    try:
        hf = hf_files.read_config(path)
        mismatches = spec.hf_mismatches(hf, cfg.model)
        errors = [] if mismatches else spec.hf_weights(path, cfg.model).shape_errors()
    except Exception as e:
        raise ConfigError(key, f"{path} is unreadable ({type(e).__name__}: {e})") from None
    if mismatches:
        hf_key, ours, theirs, now = mismatches[0]
        raise ConfigError(key, f"{path}/{hf_files.CONFIG} has {hf_key}={theirs} but model.{ours} gives {now}")
    if errors:
        raise ConfigError(key, f"{path}/{hf_files.WEIGHTS}: {errors[0]}")


def validate_checkpoint(cfg, strategy_cls, run_dir: str | None) -> None:
    c, t = cfg.checkpoint, cfg.trainer
    if t.on_nonfinite not in ("abort", "skip"):
        raise ConfigError("trainer.on_nonfinite", f"unknown policy {t.on_nonfinite!r}; use abort or skip")
    if t.stop_at_step is not None and not 0 < t.stop_at_step <= t.max_steps:
        raise ConfigError("trainer.stop_at_step", f"must be in 1..trainer.max_steps={t.max_steps}, got {t.stop_at_step}")
    if c.async_save and not strategy_cls.supports_async_save:
        raise ConfigError("checkpoint.async_save", f"parallel={strategy_cls.name} saves through its own engine, "
                                                   f"not in the background; set checkpoint.async_save=false")
    if c.resume not in (None, "auto") and not os.path.isdir(c.resume):
        raise ConfigError("checkpoint.resume", f"no such checkpoint directory: {c.resume}")
    if c.initial_load is not None and not os.path.isdir(c.initial_load):
        raise ConfigError("checkpoint.initial_load", f"no such directory: {c.initial_load}")
    if c.initial_load is not None:
        validate_initial_load(cfg, c.initial_load)
    if run_dir is None:
        return
    path = resolve_resume(cfg, run_dir)
    if path is None:
        return
    try:
        meta = check_compatible(path, cfg, strategy_cls.checkpoint_format)
        if meta["format"] == "dcp":
            check_dcp_metadata(os.path.join(path, STATE))
        elif meta["format"] == "deepspeed":
            check_deepspeed_files(os.path.join(path, STATE))
        for rng_file in glob.glob(os.path.join(path, RNG, "*.pt")):
            load_tensors_only(rng_file)
    except (CheckpointError, UnsafeCheckpointError) as e:
        raise ConfigError("checkpoint.resume", str(e)) from None
    if meta["step"] >= t.max_steps:
        raise ConfigError("checkpoint.resume", f"{path} is at step {meta['step']}, not before "
                                               f"trainer.max_steps={t.max_steps}; raise trainer.max_steps")


def validate(cfg, world_size: int, strategy_cls, run_dir: str | None = None) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(missing[0], f"is required; set it on the command line, e.g. {missing[0]}=...")
    _positive(cfg, "trainer.max_steps", "trainer.global_batch_size", "trainer.micro_batch_size",
              "trainer.log_every", "optimizer.lr", "checkpoint.keep_last")
    for key in ("trainer.eval_every", "trainer.grad_clip", "checkpoint.interval", "launcher.max_restarts",
                "scheduler.warmup_steps", "seed"):
        if _select(cfg, key) < 0:
            raise ConfigError(key, f"must not be negative, got {_select(cfg, key)}")
    if cfg.launcher.nproc_per_node is not None and cfg.launcher.nproc_per_node <= 0:
        raise ConfigError("launcher.nproc_per_node", f"must be positive, got {cfg.launcher.nproc_per_node}")
    if cfg.scheduler.name not in SCHEDULES:
        raise ConfigError("scheduler.name", f"unknown schedule {cfg.scheduler.name!r}; use {' or '.join(SCHEDULES)}")
    if not 0 <= cfg.scheduler.min_lr_ratio <= 1:
        raise ConfigError("scheduler.min_lr_ratio", f"must be in [0, 1], got {cfg.scheduler.min_lr_ratio}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError("device", f"unknown device {cfg.device!r}; use auto, cpu or cuda")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "device=cuda but no CUDA device is visible; use device=cpu or auto")
    _importable("optimizer._target_", cfg.optimizer._target_)
    if cfg.zero.stage not in (0, 1, 2, 3):
        raise ConfigError("zero.stage", f"must be 0-3, got {cfg.zero.stage}")
    if cfg.activation_checkpointing.mode not in ("none", "full", "selective"):
        raise ConfigError("activation_checkpointing.mode",
                          f"unknown mode {cfg.activation_checkpointing.mode!r}; use none, full or selective")
    validate_data_files(cfg)
    validate_checkpoint(cfg, strategy_cls, run_dir)
    validate_model(cfg)
    strategy_cls.validate(cfg, world_size)
    strategy_cls.validate_batch(cfg, world_size)
    validate_data_contents(cfg)
