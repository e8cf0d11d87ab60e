"""The checkpoints' rules (config/validate.py runs them in its order): the signing key, retention, paths and
buckets, the weights checkpoint.initial_load brings, and the checkpoint a run resumes (intact, compatible, its
state and RNG files readable) before any work."""
from __future__ import annotations

import json
import os

from omegaconf import OmegaConf

from framework import storage
from framework.checkpoint.compat import check_compatible
from framework.checkpoint.names import RNG, STATE, CheckpointError
from framework.checkpoint.resume import check_intact, completed_checkpoint, resolve_resume
from framework.checkpoint.rng import read_rng
from framework.checkpoint.signing import KEY_ENV, SigningKeyError, signing_key
from framework.checkpoint.unpickle import UnsafeCheckpointError
from framework.errors import ConfigError, require_positive
from framework.evaluation.rules import every_of
from framework.evaluation.scores import PREFIX as EVAL_PREFIX
from framework.models import hf_files
from framework.models.rules import importable
from framework.models.spec import spec_for
from framework.storage.timeouts import set_timeout as set_storage_timeout


#: the keys that take a local path or an fsspec URL (framework.storage); the other path keys take local paths
URL_KEYS = ("checkpoint.dir", "checkpoint.resume", "checkpoint.initial_load")


def _model_value(cfg, key: str):
    now = cfg.model.get(key)
    return OmegaConf.to_container(now) if OmegaConf.is_config(now) else now


def take_initial_load_values(cfg, explicit: set[str] = frozenset()) -> None:
    """Admission's derivation (framework/launch/admission.py): what changes the function but no shape (norm
    epsilon, RoPE) is taken from checkpoint.initial_load's config.json into cfg.model, unless the user set it
    (`explicit`). Quiet: where the weights cannot be read or do not fit, validate_initial_load says why in its turn."""
    c = cfg.checkpoint
    if c.initial_load is None:
        return
    try:
        if storage.is_url(c.initial_load):
            if not c.storage_timeout_s > 0:
                return
            set_storage_timeout(c.storage_timeout_s)
        importable("model._target_", cfg.model._target_)
        spec = spec_for(cfg.model)
        config_json = storage.join(c.initial_load, hf_files.CONFIG)
        if not spec.has_hf_layout or not storage.isfile(config_json):
            return
        # config.json alone: the weights are downloaded (and checked) by validation, after the cheaper rules
        values = spec.hf_function_values(json.loads(storage.read_text(config_json)))
    except Exception:   # noqa: BLE001 - validate_initial_load reports it
        return
    for hf_key, ours, theirs in values:
        if _model_value(cfg, ours) == theirs:
            continue
        if f"model.{ours}" in explicit or any(k.startswith(f"model.{ours}.") for k in explicit):
            continue
        OmegaConf.update(cfg, f"model.{ours}", theirs, merge=True)


def validate_initial_load(cfg, path: str) -> None:
    """The HF-layout weights must fit cfg.model exactly: config.json's shapes and every tensor's; a value that
    changes the function but no shape and that the user set (`explicit`) to another than config.json's is refused,
    naming both values (take_initial_load_values took the others)."""
    key = "checkpoint.initial_load"
    importable("model._target_", cfg.model._target_)
    spec = spec_for(cfg.model)
    if not spec.has_hf_layout:
        raise ConfigError(key, f"loads Hugging Face weights into models with an HF layout (llama), not "
                               f"{cfg.model.get('_target_')} (model spec {spec.name})")
    if not os.path.isfile(os.path.join(path, hf_files.CONFIG)) or not hf_files.has_weights(path):
        missing = hf_files.CONFIG if not os.path.isfile(os.path.join(path, hf_files.CONFIG)) else \
            f"{hf_files.WEIGHTS} (or {hf_files.INDEX} and its shards)"
        raise ConfigError(key, f"{path} has no {missing}; write one with `python -m framework.export`")
    try:
        hf = hf_files.read_config(path)
        values = spec.hf_function_values(hf)
    except hf_files.LayoutError as e:
        raise ConfigError(key, f"{path}/{hf_files.CONFIG}: {e}") from None
    except Exception as e:
        raise ConfigError(key, f"{path} is unreadable ({type(e).__name__}: {e})") from None
    for hf_key, ours, theirs in values:     # what take_initial_load_values took; what it left contradicts the user
        if (now := _model_value(cfg, ours)) != theirs:
            raise ConfigError(f"model.{ours}", f"{now} contradicts {hf_key}={theirs} in {path}/{hf_files.CONFIG}; "
                                               f"drop model.{ours} to take the checkpoint's")
    try:
        mismatches = spec.hf_mismatches(hf, cfg.model)
        errors = [] if mismatches else spec.hf_weights(path, cfg.model).shape_errors()
    except Exception as e:
        raise ConfigError(key, f"{path} is unreadable ({type(e).__name__}: {e})") from None
    if mismatches:
        hf_key, ours, theirs, now = mismatches[0]
        raise ConfigError(key, f"{path}/{hf_files.CONFIG} has {hf_key}={theirs} but model.{ours} gives {now}")
    if errors:
        raise ConfigError(key, f"{path}: {errors[0]}")


def validate_retention(cfg) -> None:
    """checkpoint.keep_best ranks saves by checkpoint.score: every periodic save must be of a step that has it."""
    c, t = cfg.checkpoint, cfg.trainer
    if c.keep_best < 0:
        raise ConfigError("checkpoint.keep_best", f"must not be negative, got {c.keep_best}")
    if not c.keep_best or not c.enabled:
        return
    if c.score == "val_loss":
        if not t.eval_every:
            raise ConfigError("checkpoint.keep_best", "ranks checkpoints by checkpoint.score=val_loss, which "
                                                      "trainer.eval_every=0 never computes; set trainer.eval_every")
        if c.interval and c.interval % t.eval_every:
            raise ConfigError("checkpoint.keep_best", f"ranks by val_loss, computed every trainer.eval_every="
                                                      f"{t.eval_every} steps, but checkpoint.interval={c.interval} "
                                                      f"saves between them; make the interval a multiple of "
                                                      f"{t.eval_every}")
    elif c.score.startswith(f"{EVAL_PREFIX}/"):
        validate_task_score(cfg)
    elif c.interval and c.interval % t.log_every:
        raise ConfigError("checkpoint.keep_best", f"ranks by {c.score} from the metrics records, written every "
                                                  f"trainer.log_every={t.log_every} steps, but checkpoint.interval="
                                                  f"{c.interval} saves between them; make the interval a multiple "
                                                  f"of {t.log_every}")


def validate_task_score(cfg) -> None:
    """checkpoint.score=eval/<task>/<metric>: a task of eval.tasks, evaluated at every periodic save."""
    c, task = cfg.checkpoint, cfg.checkpoint.score.split("/")[1]
    if task not in cfg.eval.tasks:
        raise ConfigError("checkpoint.score", f"ranks by {c.score}, but eval.tasks={list(cfg.eval.tasks)} does not "
                                              f"evaluate {task}; add it: eval.tasks=[{task}]")
    every = every_of(cfg)
    if c.interval and c.interval % every:
        raise ConfigError("checkpoint.keep_best", f"ranks by {c.score}, evaluated every {every} steps (eval.every, "
                                                  f"else trainer.eval_every), but checkpoint.interval={c.interval} "
                                                  f"saves between them; make the interval a multiple of {every}")


def validate_urls(cfg) -> None:
    """Each of URL_KEYS holds a local path or a URL the storage layer can use (before anything reads it)."""
    for key in URL_KEYS:
        value = OmegaConf.select(cfg, key)
        if value is not None and (problem := storage.url_problem(value)) is not None:
            raise ConfigError(key, problem)


def validate_storage(cfg, strategy_cls, probe: bool) -> None:
    """checkpoint.dir as a URL: a strategy that writes there, and (`probe`: at launch, not where manifests are
    written for a cluster with credentials of its own) a bucket this process can write to (an object written and
    deleted), so a missing bucket or a refused access stops the job before any work. Sets this process's
    checkpoint.storage_timeout_s first."""
    c = cfg.checkpoint
    require_positive(cfg, "checkpoint.storage_timeout_s")
    set_storage_timeout(c.storage_timeout_s)      # this process's requests, from the checks below on
    if not storage.is_url(c.dir):
        return
    if not strategy_cls.saves_to_urls:
        raise ConfigError("checkpoint.dir", f"parallel={strategy_cls.name} saves through its own engine to a file "
                                            f"system path, not to {c.dir}; use a path (a mounted bucket), or a "
                                            f"strategy that checkpoints through torch.distributed.checkpoint")
    if probe and (c.enabled or c.resume):
        try:
            storage.check_writable(c.dir)
        except storage.StorageError as e:
            raise ConfigError("checkpoint.dir", str(e)) from None


def validate_checkpoint(cfg, strategy_cls, run_dir: str | None) -> None:
    c, t = cfg.checkpoint, cfg.trainer
    try:
        signing_key()
    except SigningKeyError as e:
        raise ConfigError(KEY_ENV, e.reason) from None
    if t.stop_at_step is not None and not 0 < t.stop_at_step <= t.max_steps:
        raise ConfigError("trainer.stop_at_step", f"must be in 1..trainer.max_steps={t.max_steps}, got {t.stop_at_step}")
    if c.async_save and not strategy_cls.supports_async_save:
        raise ConfigError("checkpoint.async_save", f"parallel={strategy_cls.name} saves through its own engine, "
                                                   f"not in the background; set checkpoint.async_save=false")
    if c.async_save and cfg.get("lora") is not None and cfg.lora.enabled and cfg.lora.base_dtype == "nf4":
        raise ConfigError("checkpoint.async_save", "a background save stages a copy of every tensor, which torchao's "
                                                   "NF4Tensor (lora.base_dtype=nf4) cannot make; set "
                                                   "checkpoint.async_save=false")
    validate_retention(cfg)
    validate_urls(cfg)
    validate_storage(cfg, strategy_cls, probe=run_dir is not None)
    try:
        if c.resume not in (None, "auto") and not storage.isdir(c.resume):
            raise ConfigError("checkpoint.resume", f"no such checkpoint directory: {c.resume}")
        if c.initial_load is not None and not storage.isdir(c.initial_load):
            raise ConfigError("checkpoint.initial_load", f"no such directory: {c.initial_load}")
    except OSError as e:
        raise ConfigError("checkpoint.resume" if c.resume else "checkpoint.initial_load", str(e)) from None
    if c.initial_load is not None:
        validate_initial_load(cfg, storage.local_copy(c.initial_load))
    if run_dir is None:
        return
    try:
        path = resolve_resume(cfg, run_dir)
        if path is None:
            return
        check_intact(path)
        meta = check_compatible(path, cfg, strategy_cls.checkpoint_format)
        # here, not at the top: torch.distributed.checkpoint takes ~1 s to import, and only a resume needs it
        from framework.checkpoint.dcp_reader import check_metadata as check_dcp_metadata
        from framework.checkpoint.deepspeed_files import check_deepspeed_files
        if meta["format"] == "dcp":
            check_dcp_metadata(storage.join(path, STATE))
        elif meta["format"] == "deepspeed":
            check_deepspeed_files(os.path.join(path, STATE))
        for name in storage.listdir(storage.join(path, RNG)):
            read_rng(storage.join(path, RNG, name))
    except (CheckpointError, UnsafeCheckpointError, OSError) as e:
        raise ConfigError("checkpoint.resume", str(e)) from None
    if meta["step"] >= t.max_steps and path != completed_checkpoint(cfg, run_dir):
        raise ConfigError("checkpoint.resume", f"{path} is at step {meta['step']}, not before "
                                               f"trainer.max_steps={t.max_steps}; raise trainer.max_steps")
