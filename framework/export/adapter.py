"""A LoRA run's export: the base weights in the Hugging Face layout, plus the adapter in PEFT's format
(adapter/adapter_config.json and adapter/adapter_model.safetensors, which peft's PeftModel.from_pretrained
loads onto the transformers model), or with --merge the merged full weights.

An adapter's names follow its base weight's: the model spec's to_hf maps `<linear>.weight` to the HF name, and
lora_B's rows go the way the weight's rows go (a Llama q/k projection's rows are reordered for HF's rotary
layout); lora_A's columns are the linear's inputs, which no family reorders.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from framework.models.lora import is_adapter

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


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

