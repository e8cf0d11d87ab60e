"""`model=hf`: the spec of any transformers causal LM.

A fresh model (`config`) is built on every rank from torch's seed, then sharded: transformers
initialises whole modules, not one parameter from (seed, name). A `pretrained` one under a sharded
layout is never whole on a rank: under fsdp it is built with its parameters on the meta device and each
rank reads only its shards' slices from the safetensors files, by name; under DeepSpeed stage 3 zero.Init
partitions it as it is built and each rank reads one tensor at a time, keeping its flat partition.
FSDP units and activation checkpointing take the model's `_no_split_modules`. Checkpoints hold the wrapper's names (`model.` + transformers' names); export
strips that prefix and writes config.json + model.safetensors, the layout `from_pretrained` loads (and
our own families load too, as they speak the same layout). Tensor and pipeline parallelism are refused:
the spec has no plan of its own for arbitrary architectures.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from framework.errors import ConfigError
from framework.models import hf_files
from framework.models.hf.model import (NO_REMOTE_CODE, HFCausalLM, head_not_deferrable, hf_config_of,
                                       parameters_on_meta, require_transformers)
from framework.models.spec import ModelSpec, model_dict

PREFIX = "model."
# config.json keys that decide the weights' shapes, whatever the architecture calls them
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "n_embd", "n_layer", "n_head", "n_positions",
              "tie_word_embeddings")


@dataclass
class HFModelConfig:
    _target_: str = "framework.models.hf.HFCausalLM"   # the model class built (the family's)
    pretrained: Optional[str] = None    # a local dir: config.json + safetensors weights
    config: Optional[str] = None        # a dir or config.json: a fresh model from the seed
    # training: the loss projects and upcasts this many tokens' logits at a time (framework/models/loss.py), 0 = all at once
    loss_chunk_tokens: int = 0


def _tied(hf_cfg) -> bool:
    return bool(getattr(hf_cfg, "tie_word_embeddings", False))


class _Weights:
    """A saved HF model read back under the wrapper's parameter names, one tensor at a time."""

    def __init__(self, path: str, hf_cfg):
        self._files = hf_files.SafetensorsDir(path)
        self._tied = _tied(hf_cfg)

    def _key(self, name: str) -> str:
        key = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if key not in self._files and self._tied and key == "lm_head.weight":
            key = next(k for k in self._files.keys() if k.endswith(("embed_tokens.weight", "wte.weight")))
        return key

    def shape_errors(self) -> list[str]:
        return []     # the model is built from this very config.json: its shapes are the weights'

    def full(self, name: str) -> torch.Tensor:
        return self._files.tensor(self._present(name)).float()

    def part(self, name: str, index: tuple) -> torch.Tensor:
        """Only `index` (a shard's slices) of the tensor, read from disk alone."""
        return self._files.slice(self._present(name), index).float()

    def _present(self, name: str) -> str:
        key = self._key(name)
        if key not in self._files:
            raise hf_files.LayoutError(f"{key} is not in the saved weights")
        return key


class HFSpec(ModelSpec):
    name = "hf"
    has_hf_layout = True
    float8_kept = ("gate",)     # the MoE router of Mixtral (block_sparse_moe.gate) and Qwen3-MoE (mlp.gate)
    takes_documents = True

    def config_schema(self) -> type:
        return HFModelConfig

    def model_class(self) -> type:
        return HFCausalLM

    def build(self, model_cfg, load_weights: bool = True):
        m = model_dict(model_cfg)
        return HFCausalLM(m.get("pretrained"), m.get("config"), load_weights=load_weights,
                          loss_chunk_tokens=m.get("loss_chunk_tokens", 0))

    def prepare(self, model_cfg):
        # transformers imports an architecture's modeling module on first use
        require_transformers().AutoModelForCausalLM._model_mapping[type(self.hf_cfg(model_cfg))]

    def worker_modules(self, model_cfg) -> tuple[str, ...]:
        # the architecture's modeling module: transformers imports it on first use, ~1 s of CPU
        from transformers.models.auto.configuration_auto import model_type_to_module_name
        module = model_type_to_module_name(self.hf_cfg(model_cfg).model_type)
        return ("transformers", f"transformers.models.{module}.modeling_{module}")

    def meta_skeleton(self, model_cfg):
        with parameters_on_meta():     # transformers' RoPE buffers are computed, not read: keep them real
            return self.build(model_cfg, load_weights=False)

    def weights_dir(self, model_cfg):
        return model_dict(model_cfg).get("pretrained")

    def hf_cfg(self, model_cfg):
        m = model_dict(model_cfg)
        return hf_config_of(m.get("pretrained"), m.get("config"))

    def has_blocks(self, model_cfg) -> bool:
        return True

    def block_classes(self, model):
        return model.block_classes()

    def num_params(self, model_cfg) -> int:
        with torch.device("meta"):
            model = require_transformers().AutoModelForCausalLM.from_config(self.hf_cfg(model_cfg), **NO_REMOTE_CODE)
        return sum(p.numel() for p in model.parameters())

    def context_length(self, model_cfg):
        cfg = self.hf_cfg(model_cfg)
        return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    def validate(self, cfg) -> None:
        require_transformers()
        m = cfg.model
        if bool(m.pretrained) == bool(m.config):
            raise ConfigError("model.pretrained", "model=hf needs exactly one of model.pretrained=<local dir with "
                                                  "config.json and safetensors> or model.config=<dir or config.json>")
        key, path = ("model.pretrained", m.pretrained) if m.pretrained else ("model.config", m.config)
        if not os.path.exists(path):
            raise ConfigError(key, f"no such file or directory: {path}")
        if m.pretrained and not hf_files.has_weights(path):
            raise ConfigError(key, f"{path} holds no {hf_files.WEIGHTS} (safetensors weights; no hub access here)")
        try:
            hf_cfg = self.hf_cfg(m)
            from transformers import AutoModelForCausalLM
            AutoModelForCausalLM._model_mapping[type(hf_cfg)]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(key, f"transformers cannot build a causal LM from {path}: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        if cfg.data.vocab_size > hf_cfg.vocab_size:
            raise ConfigError("data.vocab_size", f"{cfg.data.vocab_size} exceeds the model's vocab_size="
                                                 f"{hf_cfg.vocab_size} ({path})")
        if m.loss_chunk_tokens < 0:
            raise ConfigError("model.loss_chunk_tokens", f"must be 0 (project all tokens at once) or a positive "
                                                         f"number of tokens a chunk, got {m.loss_chunk_tokens}")
        if m.loss_chunk_tokens and (why := head_not_deferrable(hf_cfg)):
            raise ConfigError("model.loss_chunk_tokens", f"{path}: {why}; set model.loss_chunk_tokens=0")
        longest = self.context_length(m)
        if longest and cfg.data.seq_len > longest:
            raise ConfigError("data.seq_len", f"{cfg.data.seq_len} exceeds the model's {longest} positions ({path})")

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        if tp > 1 or pp > 1:
            raise ConfigError("parallel.tp" if tp > 1 else "parallel.pp",
                              "model=hf has no tensor-parallel plan or pipeline split; use parallel=fsdp or "
                              "deepspeed (or our own families, model=gpt2_* / llama sizes, for parallel=3d)")

    def hf_config(self, model_cfg) -> dict:
        config = self.hf_cfg(model_cfg).to_dict()
        config["torch_dtype"] = "float32"
        return config

    def to_hf(self, state, model_cfg):
        tied = _tied(self.hf_cfg(model_cfg))
        out = {}
        for name, tensor in state.items():
            key = name[len(PREFIX):] if name.startswith(PREFIX) else name
            if tied and key == "lm_head.weight":
                continue
            out[key] = tensor.detach().float().cpu().contiguous()
        return out

    def hf_linear(self, name, rows, model_cfg):
        return (name[len(PREFIX):] if name.startswith(PREFIX) else name), rows

    def hf_mismatches(self, hf_config, model_cfg):
        ours = self.hf_cfg(model_cfg).to_dict()
        return [(k, "model.pretrained/config", hf_config.get(k), ours.get(k)) for k in SHAPE_KEYS
                if k in hf_config or k in ours if hf_config.get(k) != ours.get(k)]

    def hf_weights(self, path, model_cfg):
        return _Weights(path, self.hf_cfg(model_cfg))


SPEC = HFSpec()
