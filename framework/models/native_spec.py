"""What our own decoder families (Llama, GPT-2) share as specs: arguments from a dataclass, per-name
init, a TP plan and pipeline split from the family's parallelize module, an HF adapter module, and the
basic shape rules. A family names its pieces; anything it does differently it overrides."""
from __future__ import annotations

import copy
import importlib
from types import ModuleType
from typing import Callable

from omegaconf import OmegaConf
from torch import nn

from framework.errors import ConfigError
from framework.models.spec import ModelSpec, model_dict


def stage_with_layers(model: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """A copy of `model` keeping only stage `stage_index`'s equal share of `model.layers` (a ModuleDict
    keyed by index), so parameter names stay those of the full model."""
    per_stage = len(model.layers) // num_stages
    mine = set(range(stage_index * per_stage, (stage_index + 1) * per_stage))
    stage = copy.deepcopy(model)
    for key in list(stage.layers):
        if int(key) not in mine:
            del stage.layers[key]
    return stage


class NativeDecoderSpec(ModelSpec):
    init_by_name = True
    supports_pipeline = True
    context_parallel = True
    takes_documents = True
    has_hf_layout = True
    args_class: type                 # a dataclass: n_layers, init_std, num_params(), flops_per_token(seq_len)
    block_class: type
    init_fn: Callable                # (tensor, name, seed, n_layers, std) -> None
    # the module with tensor_parallel_plan(model, sequence_parallel) and pipeline_stage(model, i, n), by name:
    # it imports DTensor, which only a worker that shards the model needs
    plans: str
    adapter: ModuleType              # hf_config(args), to_hf(state, args), config_mismatches(hf, args),
                                     # function_values(hf), HFWeights

    def args(self, model_cfg):
        fields = self.args_class.__dataclass_fields__
        return self.args_class(**{k: v for k, v in model_dict(model_cfg).items() if k in fields})

    def init_parameter(self, model_cfg, name, tensor, seed) -> None:
        args = self.args(model_cfg)
        self.init_fn(tensor, name, seed, args.n_layers, args.init_std)

    def tensor_parallel_plan(self, model, sequence_parallel):
        return importlib.import_module(self.plans).tensor_parallel_plan(model, sequence_parallel)

    def num_layers(self, model_cfg) -> int:
        return self.args(model_cfg).n_layers

    def with_layers(self, model_cfg, n_layers: int):
        fewer = OmegaConf.create(OmegaConf.to_container(model_cfg, resolve=True))
        fewer.n_layers = n_layers
        return fewer

    def pipeline_stage(self, model, stage_index, num_stages):
        return importlib.import_module(self.plans).pipeline_stage(model, stage_index, num_stages)

    def block_classes(self, model):
        return (self.block_class,)

    def has_blocks(self, model_cfg) -> bool:
        return True

    def num_params(self, model_cfg) -> int:
        return self.args(model_cfg).num_params()

    def flops_per_token(self, model_cfg, seq_len: int) -> float:
        return self.args(model_cfg).flops_per_token(seq_len)

    def validate(self, cfg) -> None:
        model = cfg.model
        for key in ("dim", "n_layers", "n_heads", "vocab_size", "max_seq_len"):
            if model[key] <= 0:
                raise ConfigError(f"model.{key}", f"must be positive, got {model[key]}")
        if model.dim % model.n_heads:
            raise ConfigError("model.dim", f"{model.dim} is not divisible by model.n_heads={model.n_heads}")
        if cfg.data.seq_len > model.max_seq_len:
            raise ConfigError("data.seq_len", f"{cfg.data.seq_len} exceeds model.max_seq_len={model.max_seq_len}")
        if model.loss_chunk_tokens < 0:
            raise ConfigError("model.loss_chunk_tokens", f"must be 0 (project all tokens at once) or a positive "
                                                         f"number of tokens a chunk, got {model.loss_chunk_tokens}")
        if cfg.data.vocab_size > model.vocab_size:
            raise ConfigError("model.vocab_size", f"{model.vocab_size} is smaller than the data's vocabulary "
                                                  f"(data.vocab_size={cfg.data.vocab_size})")

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        # The tensor-parallel head hands back whole logits (a DTensor gathered over the vocabulary), so the
        # chunked loss would gather each chunk's; not built: a vocabulary-parallel loss is the way there.
        if tp > 1 and cfg.model.loss_chunk_tokens:
            raise ConfigError("model.loss_chunk_tokens", f"the chunked loss does not run under parallel.tp={tp} "
                                                         f"(the head is split over the vocabulary); use "
                                                         f"model.loss_chunk_tokens=0 or parallel.tp=1")

    def hf_config(self, model_cfg) -> dict:
        return self.adapter.hf_config(self.args(model_cfg))

    def to_hf(self, state, model_cfg):
        return self.adapter.to_hf(state, self.args(model_cfg))

    def hf_linear(self, name, rows, model_cfg):
        if not hasattr(self.adapter, "linear_to_hf"):
            return super().hf_linear(name, rows, model_cfg)
        return self.adapter.linear_to_hf(name, rows, self.args(model_cfg))

    def hf_mismatches(self, hf_config, model_cfg):
        return self.adapter.config_mismatches(hf_config, self.args(model_cfg))

    def hf_function_values(self, hf_config):
        return self.adapter.function_values(hf_config)

    def hf_weights(self, path, model_cfg):
        return self.adapter.HFWeights(path, self.args(model_cfg))
