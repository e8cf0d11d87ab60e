"""The model's and LoRA's rules (config/validate.py runs them in its order): a model class that imports, its
spec's own rules, what its spec takes; LoRA's sizes, precision and linears to adapt."""
from __future__ import annotations

from hydra.utils import get_class

from framework.errors import ConfigError, MissingExtra, installed, require_positive
from framework.models.spec import spec_for


EXAMPLE_TARGET = "framework.models.llama.Llama"


def importable(key: str, target: str) -> type:
    try:
        return get_class(target)
    except Exception:
        raise ConfigError(key, f"cannot import {target!r}; give a class path such as {EXAMPLE_TARGET}") from None


def validate_model(cfg) -> None:
    model = cfg.model
    if "_target_" not in model or not model._target_:
        raise ConfigError("model._target_", "missing: name the nn.Module class to train")
    importable("model._target_", model._target_)
    spec = spec_for(model)
    spec.validate(cfg)
    if cfg.data.document_mask and not spec.takes_documents:
        raise ConfigError("data.document_mask", f"{model._target_} (model spec {spec.name}) takes no document "
                                                f"boundaries; set data.document_mask=false or use a model that does "
                                                f"(llama, gpt2, moe, hf)")


def validate_lora(cfg) -> None:
    """lora.*: positive sizes, a precision that leaves the linears as they are, and linears to adapt."""
    c = cfg.lora
    if not c.enabled:
        return
    require_positive(cfg, "lora.rank", "lora.alpha")
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
