"""A LoRA run's export: the base weights in the Hugging Face layout, plus the adapter in PEFT's format
(adapter/adapter_config.json and adapter/adapter_model.safetensors, which peft's PeftModel.from_pretrained
loads onto the transformers model), or with --merge the merged full weights. `load_adapter` reads it back onto
our own model (framework.generate on an export dir).

An adapter's names follow its base weight's: the model spec's to_hf maps `<linear>.weight` to the HF name, and
lora_B's rows go the way the weight's rows go (a Llama q/k projection's rows are reordered for HF's rotary
layout); lora_A's columns are the linear's inputs, which no family reorders.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from framework.models import lora
from framework.models.hf_files import LayoutError
from framework.models.lora import is_adapter

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
#: PEFT's names of an adapter's tensors -> ours
PEFT_TENSORS = {".lora_A.weight": "lora_A", ".lora_B.weight": "lora_B", ".lora_magnitude_vector": "lora_magnitude"}
#: adapter_config.json settings our adapters do not compute, and the value they must have (what write_adapter writes)
PEFT_FIXED = {"bias": "none", "fan_in_fan_out": False, "use_rslora": False, "modules_to_save": None,
              "rank_pattern": {}, "alpha_pattern": {}, "lora_bias": False}


def split_state(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(base weights, adapter parameters) of a checkpoint's state."""
    return ({k: v for k, v in state.items() if not is_adapter(k)}, {k: v for k, v in state.items() if is_adapter(k)})


def _modules(adapters: dict) -> list[str]:
    return sorted({name.rsplit(".", 1)[0] for name in adapters})


def delta(adapters: dict, module: str, base: torch.Tensor, lora_cfg) -> torch.Tensor:
    """The adapter's change of `module`'s weight: B A alpha / rank (DoRA: rescaled to the magnitude)."""
    a, b = adapters[f"{module}.lora_A"].float(), adapters[f"{module}.lora_B"].float()
    change = b @ a * (lora_cfg.alpha / lora_cfg.rank)
    magnitude = adapters.get(f"{module}.lora_magnitude")
    if magnitude is None:
        return change
    merged = base.float() + change
    return merged * (magnitude.float() / merged.norm(dim=1)).unsqueeze(1) - base.float()


def merged(base: dict, adapters: dict, lora_cfg) -> dict[str, torch.Tensor]:
    """The base weights with every adapter merged in."""
    out = dict(base)
    for module in _modules(adapters):
        name = f"{module}.weight"
        out[name] = base[name].float() + delta(adapters, module, base[name], lora_cfg)
    return out


def _hf_module(spec, model_cfg, module: str, rows: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(the HF module name of our linear `module`, `rows` (out x anything) in HF's row order)."""
    name, tensor = spec.hf_linear(f"{module}.weight", rows, model_cfg)
    return name[:-len(".weight")], tensor


def write_adapter(out_dir: str, spec, model_cfg, adapters: dict, lora_cfg) -> list[str]:
    """adapter/adapter_model.safetensors and adapter/adapter_config.json, in PEFT's names and layout."""
    tensors, targets = {}, set()
    for module in _modules(adapters):
        hf_module, b = _hf_module(spec, model_cfg, module, adapters[f"{module}.lora_B"].float())
        b = b.contiguous()
        tensors[f"{PEFT_PREFIX}{hf_module}.lora_A.weight"] = adapters[f"{module}.lora_A"].float().contiguous()
        tensors[f"{PEFT_PREFIX}{hf_module}.lora_B.weight"] = b.contiguous()
        magnitude = adapters.get(f"{module}.lora_magnitude")
        if magnitude is not None:
            # a per-row vector: its rows follow the weight's as lora_B's do
            _, m = _hf_module(spec, model_cfg, module, magnitude.float()[:, None])
            tensors[f"{PEFT_PREFIX}{hf_module}.lora_magnitude_vector"] = m[:, 0].contiguous()
        targets.add(hf_module.rsplit(".", 1)[-1])
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora_cfg.rank, "lora_alpha": lora_cfg.alpha,
              "lora_dropout": lora_cfg.dropout, "use_dora": bool(lora_cfg.dora), "target_modules": sorted(targets),
              "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True, "modules_to_save": None,
              "base_model_name_or_path": None, "inference_mode": True}
    folder = os.path.join(out_dir, ADAPTER_DIR)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(folder, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    return [ADAPTER_DIR]


class AdapterError(LayoutError):
    """An export's adapter/ that generate cannot apply; reported as one line, exit code 2."""


def _adapter_config(folder: str) -> tuple[int, float, bool]:
    """(rank, alpha, dora) of adapter_config.json, read as data; AdapterError for anything else."""
    where = os.path.join(folder, ADAPTER_CONFIG)
    try:
        with open(where) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise AdapterError(f"{where}: unreadable ({type(e).__name__})") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise AdapterError(f"{where}: peft_type: not LORA")
    rank, alpha, dora = config.get("r"), config.get("lora_alpha"), config.get("use_dora", False)
    if type(rank) is not int or rank <= 0:
        raise AdapterError(f"{where}: r: {rank!r} is not a positive integer")
    if type(alpha) not in (int, float) or type(dora) is not bool:
        raise AdapterError(f"{where}: lora_alpha / use_dora: {alpha!r} / {dora!r} are not a number and a bool")
    for key, value in PEFT_FIXED.items():
        if config.get(key) and config[key] != value:
            raise AdapterError(f"{where}: {key}: {config[key]!r}; generate applies adapters as framework.export "
                               f"writes them ({key}={value!r}): export with --merge instead")
    return rank, float(alpha), dora


@torch.no_grad()
def load_adapter(export_dir: str, spec, model_cfg, model) -> None:
    """Put the adapter of an export dir (write_adapter's files) on `model`, built from its base weights: the
    linears it names become LoRALinear modules holding its values in our layout, as the checkpoint's model had
    them (lora_B's and the magnitude's rows back from HF's row order)."""
    folder = os.path.join(export_dir, ADAPTER_DIR)
    rank, alpha, dora = _adapter_config(folder)
    where = os.path.join(folder, ADAPTER_WEIGHTS)
    try:
        tensors = load_file(where)
    except (OSError, ValueError) as e:      # safetensors' own errors are ValueError's
        raise AdapterError(f"{where}: unreadable ({type(e).__name__})") from None
    ours = {}       # HF module name -> (our linear's name, order: HF's row i is our row order[i])
    for name in lora.target_linears(model, spec.block_classes(model), (), spec.lora_skip()):
        rows = model.get_submodule(name).out_features
        try:
            hf_name, order = _hf_module(spec, model_cfg, name, torch.arange(rows, dtype=torch.float64)[:, None])
        except LayoutError:
            continue
        ours[hf_name] = (name, order[:, 0].long())
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        suffix = next((s for s in PEFT_TENSORS if key.endswith(s)), None)
        hf_name = key[len(PEFT_PREFIX):-len(suffix)] if key.startswith(PEFT_PREFIX) and suffix else None
        if hf_name not in ours:
            raise AdapterError(f"{where}: {key} names no adaptable linear of this {spec.name} model")
        found.setdefault(hf_name, {})[PEFT_TENSORS[suffix]] = tensor.float()
    lora.apply_lora(model, sorted(ours[m][0] for m in found), rank, alpha, 0.0, dora)
    for hf_name, parts in found.items():
        name, order = ours[hf_name]
        module = model.get_submodule(name)
        wanted = {"lora_A": module.lora_A, "lora_B": module.lora_B}
        if dora:
            wanted["lora_magnitude"] = module.lora_magnitude
        if set(parts) != set(wanted) or any(parts[k].shape != p.shape for k, p in wanted.items()):
            raise AdapterError(f"{where}: {hf_name}: {sorted(parts)} of shapes "
                               f"{[tuple(t.shape) for t in parts.values()]} do not fit its linear "
                               f"({module.in_features} -> {module.out_features}, rank {rank}, dora {dora})")
        for key, param in wanted.items():
            value = parts[key]
            if key != "lora_A":         # rows follow the weight's: HF row i holds our row order[i]
                value = torch.empty_like(value).index_copy_(0, order, value)
            param.copy_(value)

