"""Cross-field rules, checked in the launching process before any worker or process group exists.

Each rule raises ConfigError(key, message) with the numbers involved and what would work.
"""
from __future__ import annotations

import importlib.util
import math
import os

import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from framework import storage
from framework.runtime import determinism
from framework.checkpoint.manager import (RNG, STATE, CheckpointError, check_compatible, check_intact,
                                         completed_checkpoint, read_rng, resolve_resume)
from framework.checkpoint.signing import KEY_ENV, SigningKeyError, signing_key
from framework.checkpoint.unpickle import UnsafeCheckpointError
from framework.config.batch_changes import validate_batch_changes
from framework.config.choices import check_choices
from framework.config.explicit import hydra_explicit_keys, is_explicit
from framework.config.unknown_keys import refuse_unknown_keys
from framework.data import tokenizer
from framework.data.sources import DataError, check_token_range, source_of, streams
from framework.errors import ConfigError, MissingExtra, installed
from framework.metrics.trackers import TRACKERS, tracker_class
from framework.metrics.trackers.mlflow_tracker import tracking_uri
from framework.models import hf_files
from framework.models.spec import spec_for
from framework.parallel.activation_checkpointing import check_mode as check_ac_mode
from framework.runtime.devices import check_visible_gpus
from framework.runtime.engines import workers_here
from framework.runtime.preemption import signal_number
from framework.storage.timeouts import set_timeout as set_storage_timeout

EXAMPLE_TARGET = "framework.models.llama.Llama"
#: the keys that take a local path or an fsspec URL (framework.storage); the other path keys take local paths
URL_KEYS = ("checkpoint.dir", "checkpoint.resume", "checkpoint.initial_load")


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


def _module_exists(name: str) -> bool:
    """Whether `name` is a module (finding a submodule imports its parents; the fork server would anyway)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def validate_model(cfg) -> None:
    model = cfg.model
    if "_target_" not in model or not model._target_:
        raise ConfigError("model._target_", "missing: name the nn.Module class to train")
    _importable("model._target_", model._target_)
    spec = spec_for(model)
    spec.validate(cfg)
    if cfg.data.document_mask and not spec.takes_documents:
        raise ConfigError("data.document_mask", f"{model._target_} (model spec {spec.name}) takes no document "
                                                f"boundaries; set data.document_mask=false or use a model that does "
                                                f"(llama, gpt2, moe, hf)")


def validate_data_files(cfg, explicit: set[str] = frozenset()) -> None:
    data = cfg.data
    _positive(cfg, "data.seq_len", "data.vocab_size")
    if not 0 <= data.val_fraction < 1:
        raise ConfigError("data.val_fraction", f"must be in [0, 1), got {data.val_fraction}")
    source = source_of(data)
    source.check(data)
    if not data.packing and source.mixture:
        raise ConfigError("data.packing", f"data.source={data.source} deals rows of data.seq_len out of several "
                                          f"sources; one example a row (data.packing=false) is not built for a "
                                          f"mixture: set data.packing=true, or train one dataset (data=tokens)")
    if not data.packing:
        # one example a row has no other document to keep it from, and causal attention keeps its padding out of
        # view: no document numbers are built (data/rows.py padded), and the resolved config says so
        data.document_mask = False
    if not data.packing and is_explicit("data.overlong", explicit):
        raise ConfigError("data.overlong", "splits or cuts examples in packed rows; with data.packing=false an "
                                           "example longer than a row is truncated to data.seq_len + 1 tokens "
                                           "(TRL's max_length): leave data.overlong unset")


def _long_enough(n_tokens: int, seq_len: int, val_fraction: float, evaluates: bool) -> bool:
    val = int(n_tokens * val_fraction)
    return n_tokens - val >= seq_len + 1 and (not evaluates or val >= seq_len + 1)


def _shortest_corpus(seq_len: int, val_fraction: float, evaluates: bool) -> int:
    n = seq_len + 1
    if evaluates:
        n = max(n, math.ceil((seq_len + 1) / val_fraction))
    while not _long_enough(n, seq_len, val_fraction, evaluates):
        n += 1
    return n


def validate_data_contents(cfg) -> None:
    """Opens the data (memmaps; a prepared dataset's token range comes from its manifest, the others'
    are scanned): the last check, after the cheap ones passed."""
    data = cfg.data
    mixture = source_of(data).mixture
    try:
        found = streams(data)
        for stream in found:
            if stream.manifest is None:
                check_token_range(stream.tokens, data.vocab_size, stream.name)
            elif stream.manifest["vocab_size"] > data.vocab_size:
                raise DataError(f"data.vocab_size: {stream.name} was tokenized with a vocabulary of "
                                f"{stream.manifest['vocab_size']}, but data.vocab_size is {data.vocab_size}")
    except DataError as e:
        key, _, msg = str(e).partition(": ")
        raise ConfigError(key, msg) from None
    for stream in found:
        if not data.packing and stream.mask is None:
            raise ConfigError("data.packing", f"data.source={data.source} ({stream.name}) is a token stream, not "
                                              f"examples (instruction data with a loss mask, as data=chat prepares "
                                              f"it): one example a row means nothing there; set data.packing=true")
        if data.document_mask and stream.starts is None:
            raise ConfigError("data.document_mask", f"data.source={data.source} ({stream.name}) records no document "
                                                    f"boundaries (a dataset dir from `python -m framework.data."
                                                    f"prepare` does); set data.document_mask=false")
        if stream.mask is not None:
            _enough_examples(cfg, stream, mixture)
    # With no validation fraction at all, the trainer.eval_every rule below says what to change.
    evaluates = bool(cfg.trainer.eval_every) and data.val_fraction > 0
    for stream in (s for s in found if s.mask is None):
        n = len(stream.tokens)
        if not mixture and data.path and not _long_enough(n, data.seq_len, data.val_fraction, evaluates):
            split = f" plus a validation split (data.val_fraction={data.val_fraction}) of as many" if evaluates else ""
            raise ConfigError("data.path", f"{data.path} is empty" if not n else
                              f"{data.path} is too short: it holds {n} tokens, one training sequence needs "
                              f"{data.seq_len + 1}{split}, so at least "
                              f"{_shortest_corpus(data.seq_len, data.val_fraction, evaluates)} tokens")
        where = f" in {stream.name}" if mixture else ""
        n_val = int(n * data.val_fraction)
        if n - n_val < data.seq_len + 1:
            raise ConfigError("data.seq_len", f"the training split{where} holds {n - n_val} tokens, "
                                              f"fewer than one sequence of {data.seq_len + 1}")
        if cfg.trainer.eval_every and n_val < data.seq_len + 1:
            raise ConfigError("trainer.eval_every", f"evaluation needs a validation split{where} of at least one "
                                                    f"sequence; raise data.val_fraction or set trainer.eval_every=0")


def _enough_examples(cfg, stream, mixture: bool) -> None:
    """Instruction data is packed whole, or one example a row: its training split needs an example (one a row:
    one that data.seq_len leaves a trained target), its validation split one more where evaluation runs."""
    from framework.data.batches import layout_of, split_stream
    train, val = split_stream(stream, cfg.data.val_fraction)
    where = f" in {stream.name}" if mixture else ""
    if len(train.starts) < 2:
        raise ConfigError("data.path", f"the training split{where} holds no example")
    if not cfg.data.packing and not len(layout_of(train, cfg.data)):
        raise ConfigError("data.seq_len", f"every example of the training split{where} is cut to data.seq_len + 1 = "
                                          f"{cfg.data.seq_len + 1} tokens with no trained target left; raise it")
    if cfg.trainer.eval_every and len(val.starts) < 2:
        raise ConfigError("trainer.eval_every", f"evaluation needs a validation split{where} of at least one "
                                                f"example; raise data.val_fraction or set trainer.eval_every=0")


def validate_lora(cfg) -> None:
    """lora.*: positive sizes, a precision that leaves the linears as they are, and linears to adapt."""
    c = cfg.lora
    if not c.enabled:
        return
    _positive(cfg, "lora.rank", "lora.alpha")
    if not 0 <= c.dropout < 1:
        raise ConfigError("lora.dropout", f"must be in [0, 1), got {c.dropout}")
    if c.base_dtype in ("nf4", "float8") and not installed("torchao"):
        raise MissingExtra("lora.base_dtype", f"lora.base_dtype={c.base_dtype} weights are made by", "torchao", "qlora")
    if cfg.precision.name == "float8":
        raise ConfigError("lora.enabled", "precision=float8 converts the linears the adapters sit on; train "
                                          "adapters with precision=bf16 (lora.base_dtype=float8 stores the frozen "
                                          "weights in float8)")
    from framework.models.factory import ModelFactory
    import torch
    factory = ModelFactory(cfg)
    with torch.device("meta"):
        model = factory.spec.build(cfg.model, load_weights=False)
    if not factory.lora_names(model):
        wanted = f"named {', '.join(c.targets)} " if c.targets else ""
        raise ConfigError("lora.targets", f"{cfg.model._target_} has no nn.Linear {wanted}in its blocks "
                                          f"({', '.join(t.__name__ for t in factory.spec.block_classes(model)) or 'none'}) "
                                          f"to adapt")


def validate_profile(cfg) -> None:
    steps = list(cfg.trainer.profile.steps or [])
    if steps and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
        raise ConfigError("trainer.profile.steps", f"give [first, last] with 1 <= first <= last, got {steps}")


def validate_sampling(cfg) -> None:
    t = cfg.trainer
    if t.sample_every < 0 or t.sample_tokens <= 0:
        raise ConfigError("trainer.sample_every" if t.sample_every < 0 else "trainer.sample_tokens",
                          f"must be {'non-negative' if t.sample_every < 0 else 'positive'}")
    if not t.sample_every:
        return
    tok = tokenizer.of_data(cfg.data)
    if tok is None:
        raise ConfigError("trainer.sample_every", f"needs the data's tokenizer; data.source={cfg.data.source} names "
                                                  f"none: set data.tokenizer=/path/to/tokenizer.json")
    from framework.metrics.samples import start_tokens
    start, vocab = start_tokens(tok, t.sample_prompt), cfg.data.vocab_size
    outside = [i for i in start if i >= vocab]
    if start and not outside:
        return
    empty = "is empty" if not t.sample_prompt else f"{t.sample_prompt!r} encodes to no token"
    if tok.encode(t.sample_prompt, add_special_tokens=False).ids:
        why = f"{t.sample_prompt!r} encodes to token {outside[0]}, which the data never holds"
    elif start:
        why = (f"{empty}, so a sample would start from the tokenizer's "
               f"{'BOS' if tokenizer.bos_ids(tok) else 'end-of-text'} token ({outside[0]}), which the data never holds")
    else:
        why = f"{empty}, and the data's tokenizer has no BOS or end-of-text token to start a sample from"
    raise ConfigError("trainer.sample_prompt", f"{why} (data.source={cfg.data.source}, data.vocab_size={vocab}); "
                                               f"give the samples a start, e.g. trainer.sample_prompt='The '")


def validate_logging(cfg) -> None:
    _positive(cfg, "logging.tracker_timeout_s")
    names = list(cfg.logging.trackers)
    for name in names:
        if name not in TRACKERS:
            raise ConfigError("logging.trackers", f"{name!r} is not a tracker; use any of {', '.join(TRACKERS)} "
                                                  f"(metrics.jsonl is always written)")
        if importlib.util.find_spec(tracker_class(name).package) is None:
            raise ConfigError("logging.trackers", f"{name} needs its client library: pip install 'framework[{name}]'")
    if len(set(names)) != len(names):
        raise ConfigError("logging.trackers", f"names a tracker twice: {names}")
    if "mlflow" in names and not tracking_uri(cfg):
        raise ConfigError("logging.mlflow_tracking_uri", "logging.trackers has mlflow but no tracking server is "
                                                         "given; set logging.mlflow_tracking_uri=http://HOST:PORT "
                                                         "or MLFLOW_TRACKING_URI")


def validate_initial_load(cfg, path: str, explicit: set[str] = frozenset()) -> None:
    """The HF-layout weights must fit cfg.model exactly: config.json's shapes and every tensor's. What changes
    the function but no shape (norm epsilon, RoPE) is taken from config.json into cfg.model, unless the
    user set it (`explicit`) to something else: that is refused, naming both values."""
    key = "checkpoint.initial_load"
    _importable("model._target_", cfg.model._target_)
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
    for hf_key, ours, theirs in values:
        now = cfg.model.get(ours)
        now = OmegaConf.to_container(now) if OmegaConf.is_config(now) else now
        if now == theirs:
            continue
        if is_explicit(f"model.{ours}", explicit) or any(k.startswith(f"model.{ours}.") for k in explicit):
            raise ConfigError(f"model.{ours}", f"{now} contradicts {hf_key}={theirs} in {path}/{hf_files.CONFIG}; "
                                               f"drop model.{ours} to take the checkpoint's")
        OmegaConf.update(cfg, f"model.{ours}", theirs, merge=True)
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
    elif c.interval and c.interval % t.log_every:
        raise ConfigError("checkpoint.keep_best", f"ranks by {c.score} from the metrics records, written every "
                                                  f"trainer.log_every={t.log_every} steps, but checkpoint.interval="
                                                  f"{c.interval} saves between them; make the interval a multiple "
                                                  f"of {t.log_every}")


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
    _positive(cfg, "checkpoint.storage_timeout_s")
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


def validate_checkpoint(cfg, strategy_cls, run_dir: str | None, explicit: set[str] = frozenset()) -> None:
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
        validate_initial_load(cfg, storage.local_copy(c.initial_load), explicit)
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


def validate(cfg, world_size: int, strategy_cls, run_dir: str | None = None,
             explicit: set[str] | None = None) -> None:
    """Completes the values derived from others (written into cfg, so the saved config shows them), then
    checks every rule."""
    refuse_unknown_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(missing[0], f"is required; set it on the command line, e.g. {missing[0]}=...")
    check_choices(cfg)
    explicit = hydra_explicit_keys() if explicit is None else explicit
    strategy_cls.adopt_user_files(cfg, world_size, explicit)
    strategy_cls.check_world(cfg, world_size)
    # Every batch rule, once; an unset micro_batch_size is filled in so that the saved config shows it.
    cfg.trainer.micro_batch_size = strategy_cls.batch_layout(cfg, world_size).micro_batch
    _positive(cfg, "trainer.max_steps", "trainer.log_every", "optimizer.lr", "checkpoint.keep_last", "launcher.timeout_s",
              "launcher.stop_grace_s")
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
    _importable("optimizer._target_", cfg.optimizer._target_)
    if cfg.zero.stage not in (0, 1, 2, 3):
        raise ConfigError("zero.stage", f"must be 0-3, got {cfg.zero.stage}")
    check_ac_mode(cfg.activation_checkpointing)
    validate_data_files(cfg, explicit)
    validate_sampling(cfg)
    validate_logging(cfg)
    validate_profile(cfg)
    validate_checkpoint(cfg, strategy_cls, run_dir, explicit)
    determinism.validate(cfg, strategy_cls)
    validate_model(cfg)
    validate_lora(cfg)
    strategy_cls.validate(cfg, world_size)
    validate_batch_changes(cfg, strategy_cls, world_size)
    validate_data_contents(cfg)
