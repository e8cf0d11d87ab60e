"""A model and its tokenizer from a checkpoint step dir or an export dir, for the commands that run one
(`python -m framework.generate`, `python -m framework.eval`): the checkpoint's config read as data
(framework/config/saved.py), its signature and files checked, its weights through the restricted readers."""
from __future__ import annotations

import os

import torch

from framework import storage
from framework.checkpoint.names import META


class LoadError(ValueError):
    """A path that holds no usable model or tokenizer."""


def _built(spec, model_cfg, where: str):
    try:
        model = spec.build(model_cfg)
    except (OSError, ValueError) as e:     # a model=hf dir that is gone, or that holds code of its own
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{where}: model: cannot be built ({type(e).__name__}: {first[:300]})") from None
    model.context_length = spec.context_length(model_cfg)
    return model


@torch.no_grad()
def from_export(path: str, trust_code: bool):
    """The export's model (its family from config.json's model_type), with its LoRA adapter/ if it has one."""
    import json

    from framework.config.saved import checked_model
    from framework.errors import ConfigError
    from framework.export.adapter import ADAPTER_DIR, load_adapter
    from framework.models import hf_files
    from framework.models.spec import spec_for_hf
    where = os.path.join(path, hf_files.CONFIG)
    try:
        hf = hf_files.read_config(path)
        spec = spec_for_hf(hf)
        model_cfg = spec.model_cfg_from_hf(hf)
    except json.JSONDecodeError as e:
        raise LoadError(f"{where}: not JSON (line {e.lineno})") from None
    except ConfigError as e:
        raise LoadError(f"{path}: {str(e).partition(': ')[2]}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{where}: not a model config this framework reads ({type(e).__name__}: {e})") from None
    spec, model_cfg = checked_model(model_cfg, where, trust_code)
    model = _built(spec, model_cfg, where)
    weights = spec.hf_weights(path, model_cfg)
    for name, param in model.named_parameters():
        param.copy_(weights.full(name))
    if os.path.isdir(os.path.join(path, ADAPTER_DIR)):
        load_adapter(path, spec, model_cfg, model)
    from framework.data.tokenizer import TOKENIZER_FILE, load_file
    tok_file = os.path.join(path, TOKENIZER_FILE)
    return model, (load_file(tok_file) if os.path.isfile(tok_file) else None)


def from_checkpoint(path: str, trust_code: bool):
    """The checkpoint's model, from its config read as data (framework/config/saved.py); a LoRA run's adapters on
    a float32 base, as the exporter merges them."""
    from framework.checkpoint.names import CONFIG, read_meta
    from framework.checkpoint.resume import damage
    from framework.config.saved import read_saved_config
    from framework.data.tokenizer import of_checkpoint
    from framework.export.read import READERS
    from framework.models import lora
    meta = read_meta(path)
    found = damage(path)       # with FRAMEWORK_CHECKPOINT_KEY set, the signature and every file's SHA-256
    if found is not None:
        raise LoadError(f"refusing {path}: {found}")
    saved = read_saved_config(path, trust_code)
    if meta.get("format") not in READERS:
        raise LoadError(f"{path} has state format {meta.get('format')!r}; generate reads {' and '.join(READERS)}")
    spec, c = saved.spec, saved.lora
    model = _built(spec, saved.model, os.path.join(path, CONFIG))
    if c.enabled:
        names = lora.target_linears(model, spec.block_classes(model), c.targets, spec.lora_skip())
        lora.apply_lora(model, names, c.rank, c.alpha, c.dropout, c.dora)
    model.load_state_dict(READERS[meta["format"]](path))
    return model, of_checkpoint(path, saved.data)


def load(path: str, trust_code: bool = False):
    """(model in eval mode, tokenizer) from a checkpoint step dir (a path or a URL) or an export dir. `trust_code`:
    a class the checkpoint's config names may be imported (TRUST_FLAG)."""
    from framework.checkpoint.names import CheckpointError
    from framework.checkpoint.signing import SigningKeyError
    from framework.checkpoint.unpickle import UnsafeCheckpointError
    from framework.config.saved import SavedConfigError
    from framework.data.tokenizer import TokenizerError
    from framework.models.hf_files import LayoutError
    try:
        if storage.isfile(storage.join(path, META)):
            model, tok = from_checkpoint(path, trust_code)
        elif os.path.isfile(os.path.join(path, "config.json")):
            model, tok = from_export(path, trust_code)
        else:
            raise LoadError(f"{path} is neither a checkpoint step dir (meta.json) nor an export dir (config.json)")
    except (CheckpointError, TokenizerError, SavedConfigError, UnsafeCheckpointError, SigningKeyError,
            LayoutError) as e:
        raise LoadError(str(e)) from None
    if tok is None:
        raise LoadError(f"{path} records no tokenizer; train with data.tokenizer=/path/to/tokenizer.json")
    return model.eval(), tok
