"""`python -m framework.export <checkpoint step dir> <out dir>`: consolidated HF safetensors + config.json,
in the Hugging Face layout of the checkpoint's model family (its spec's state-dict adapter). A LoRA run's
checkpoint gives the base weights plus the adapter in PEFT's format (export/adapter.py), or with `merge` the
merged weights. The weights are written in fp32, or in bf16 where the run stored its parameters so
(precision.store_dtype=bfloat16: the same values). The checkpoint's config.yaml is read as data
(framework/config/saved.py): it names no code to run, and nothing of the reader's environment reaches the files
written. Those get the modes of files the user creates (their umask), the folder too."""
from __future__ import annotations

import glob
import json
import os
import shutil
import stat
import uuid

import torch
from safetensors.torch import save_file

from framework import storage
from framework.checkpoint.names import CONFIG, META, CheckpointError, complete_checkpoints, read_meta
from framework.checkpoint.resume import damage, newest_intact_beside
from framework.checkpoint.signing import SigningKeyError
from framework.checkpoint.unpickle import UnsafeCheckpointError
from framework.config.saved import SavedConfig, SavedConfigError, read_saved_config
from framework.data import tokenizer as tokenizers_
from framework.export import adapter as adapters_
from framework.export.read import READERS
from framework.models import hf_files
from framework.models.spec import model_dict


class ExportError(ValueError):
    """Input the exporter cannot use; reported as one line, exit code 2."""


def _model_spec(step_dir: str, trust_code: bool) -> tuple[SavedConfig, dict]:
    """(the checkpoint's config as data, its model section as a dict) of a model with a Hugging Face layout."""
    try:
        saved = read_saved_config(step_dir, trust_code)
    except SavedConfigError as e:
        raise ExportError(str(e)) from None
    spec, model = saved.spec, model_dict(saved.model)
    if not spec.has_hf_layout:
        raise ExportError(f"{step_dir} holds model._target_={model.get('_target_')} (model spec {spec.name}), "
                          f"which has no Hugging Face layout to export to")
    try:
        spec.hf_config(model)
    except (TypeError, ValueError, OSError) as e:
        raise ExportError(f"{step_dir}/{CONFIG}: model section does not fit model spec {spec.name} "
                          f"({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]})") from None
    return saved, model


def _check_out_dir(out_dir: str, force: bool) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ExportError(f"{out_dir} exists and is not a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise ExportError(f"{out_dir} is not empty; pass --force to replace its "
                          f"{hf_files.WEIGHTS} and {hf_files.CONFIG}")


def newest_step_dir(path: str) -> str:
    """`path` if it is a checkpoint step dir; if it is a checkpoint dir (checkpoint.dir), its newest complete one."""
    if storage.isfile(storage.join(path, META)):
        return path
    found = complete_checkpoints(path)
    return found[-1] if found else path


def export(step_dir: str, out_dir: str, force: bool = False, merge: bool = False, trust_code: bool = False) -> dict:
    """Write out_dir/{model.safetensors, config.json} and the checkpoint's tokenizer (tokenizer.json,
    tokenizer_config.json, with the chat template the run trained with); a LoRA run's adapter goes to
    out_dir/adapter/ unless `merge` folds it into the weights. Return the HF config. Nothing is written on
    error. `step_dir` may be a path or a URL (s3://...). `trust_code`: a class the checkpoint's config names may
    be imported (framework/config/saved.py TRUST_FLAG)."""
    try:
        meta = read_meta(step_dir)
        found = damage(step_dir)
    except (CheckpointError, SigningKeyError) as e:
        raise ExportError(str(e)) from None
    except OSError as e:     # a bucket that is not there, an endpoint that does not answer
        raise ExportError(f"{step_dir}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if found is not None:
        intact = newest_intact_beside(step_dir)
        raise ExportError(f"refusing {step_dir}: {found}" +
                          (f"; the newest intact checkpoint beside it is {intact}" if intact else ""))
    if meta.get("format") not in READERS:
        raise ExportError(f"{step_dir} has state format {meta.get('format')!r}; "
                          f"export reads {' and '.join(READERS)}")
    saved, model = _model_spec(step_dir, trust_code)
    spec, lora_cfg = saved.spec, saved.lora
    _check_out_dir(out_dir, force)
    try:
        state = READERS[meta["format"]](step_dir)
    except UnsafeCheckpointError as e:
        raise ExportError(str(e)) from None
    except Exception as e:
        raise ExportError(f"{step_dir}: cannot read the {meta['format']} state ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    base, adapters = adapters_.split_state(state)
    if merge and not adapters:
        raise ExportError(f"{step_dir} holds no LoRA adapters to merge; export it without --merge")
    try:
        tensors = spec.to_hf(adapters_.merged(base, adapters, lora_cfg) if merge else base, model)
        write_adapter = None
        if adapters and not merge:
            for module in sorted({n.rsplit(".", 1)[0] for n in adapters}):   # every name maps, before writing
                try:
                    adapters_._hf_module(spec, model, module, adapters[f"{module}.lora_B"].float())
                except hf_files.LayoutError as e:
                    raise hf_files.LayoutError(f"{e}, so its adapter has no PEFT layout; export with --merge") \
                        from None
            write_adapter = lambda folder: adapters_.write_adapter(folder, spec, model, adapters, lora_cfg)  # noqa: E731
    except hf_files.LayoutError as e:
        raise ExportError(f"{step_dir}: {e}") from None
    config = spec.hf_config(model)
    if saved.precision.store_dtype == "bfloat16":
        tensors = {name: t.to(torch.bfloat16) for name, t in tensors.items()}   # read as fp32: exact both ways
        config["torch_dtype"] = "bfloat16"
    tok = _tokenizer(step_dir, saved)
    if tok is not None:
        _fill_special_token_ids(config, tok)
    try:
        chat = tokenizers_.chat_config_in(step_dir)
    except tokenizers_.TokenizerError as e:
        raise ExportError(str(e)) from None
    _write(out_dir, tensors, config, tok, chat, write_adapter)
    return config


def _fill_special_token_ids(config: dict, tok) -> None:
    """bos/eos ids from the tokenizer where the model's config.json names none (a pretrained model's own are
    kept) and the model has a row for them (byte-level models have no EOS row)."""
    bos = tokenizers_.bos_ids(tok)
    for key, token_id in (("eos_token_id", tokenizers_.eos_token(tok)[1]), ("bos_token_id", bos[0] if bos else None)):
        if config.get(key) is None and token_id is not None and token_id < config["vocab_size"]:
            config[key] = token_id


def _tokenizer(step_dir: str, saved: SavedConfig):
    """The checkpoint's tokenizer, to write beside the weights (None: the run recorded none)."""
    try:
        return tokenizers_.of_checkpoint(step_dir, saved.data)
    except tokenizers_.TokenizerError as e:
        raise ExportError(f"{step_dir}: {e}") from None


def _write(out_dir: str, tensors: dict, config: dict, tok=None, chat: dict | None = None, write_extra=None) -> None:
    """Into a sibling temp dir first: a failed write leaves out_dir as it was. `write_extra(folder)` writes
    more (the adapter) and returns the names it wrote."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    # made as the user's umask makes folders (tempfile.mkdtemp's are 0700): it becomes out_dir when that is new
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out_dir))}.{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)
    try:
        save_file(tensors, os.path.join(tmp, hf_files.WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(tmp, hf_files.CONFIG), "w") as f:
            json.dump(config, f, indent=2)
        names = [hf_files.WEIGHTS, hf_files.CONFIG]
        if tok is not None:
            names += tokenizers_.write_hf_files(tok, tmp, **(chat or {}))
        if write_extra is not None:
            names += write_extra(tmp)
        _modes_of_the_umask(tmp)
        if not os.path.exists(out_dir):
            os.rename(tmp, out_dir)
            return
        for name in names:
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(tmp, name), target)
        # a sharded model's index would be read instead of the file just written
        for stale in glob.glob(os.path.join(out_dir, "model-*-of-*.safetensors")) + \
                glob.glob(os.path.join(out_dir, hf_files.INDEX)):
            os.remove(stale)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _modes_of_the_umask(folder: str) -> None:
    """Every file and folder under `folder` as the user's umask makes new ones (`folder`'s own mode is one):
    safetensors writes its files 0600, while the tokenizer's and the config's get the umask's."""
    probe = os.path.join(folder, ".mode")
    open(probe, "w").close()
    file_mode, dir_mode = stat.S_IMODE(os.stat(probe).st_mode), stat.S_IMODE(os.stat(folder).st_mode)
    os.remove(probe)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), dir_mode)
        for name in files:
            os.chmod(os.path.join(root, name), file_mode)
