"""Whether a checkpoint can be continued by this run: its format version, its strategy's state format, and the
model, optimizer and vocabulary it was saved for (the layout may differ)."""
from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from framework import storage
from framework.checkpoint.names import FORMAT_VERSION, STATE, CheckpointError, read_meta


def fingerprint(cfg) -> dict:
    """What a checkpoint must agree on with the run that loads it (the layout may differ)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    return {"model": model, "optimizer": cfg.optimizer._target_, "vocab_size": cfg.data.vocab_size}


def _model_defaults(cfg) -> dict:
    """The model schema's defaults: a key a newer version added reads as its default in an older checkpoint."""
    schema = OmegaConf.get_type(cfg.model)
    if not dataclasses.is_dataclass(schema):
        return {}
    out = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def check_compatible(path: str, cfg, strategy_format: str) -> dict:
    """Refuse a checkpoint this run cannot continue from, naming the first difference."""
    meta = read_meta(path)
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {meta.get('version')}, "
                              f"this framework reads {FORMAT_VERSION}")
    if meta["format"] != strategy_format:
        raise CheckpointError(f"{path} holds {meta['format']} state (saved by parallel={meta['parallel']}); "
                              f"to move weights across, export it with `python -m framework.export` and start "
                              f"with checkpoint.initial_load")
    saved, now = meta["fingerprint"], fingerprint(cfg)
    saved["model"] = {**_model_defaults(cfg), **saved.get("model", {})}   # keys added since it was saved
    for key in now:
        if saved.get(key) != now[key]:
            if key == "model":
                diff = sorted(k for k in set(saved[key]) | set(now[key]) if saved[key].get(k) != now[key].get(k))
                detail = ", ".join(f"model.{k}: saved {saved[key].get(k)} vs now {now[key].get(k)}" for k in diff)
            else:
                detail = f"saved {saved.get(key)} vs now {now[key]}"
            raise CheckpointError(f"{path} was saved for a different {key} ({detail})")
    if not storage.listdir(storage.join(path, STATE)):
        raise CheckpointError(f"{path} has no {STATE}/ data")
    return meta
