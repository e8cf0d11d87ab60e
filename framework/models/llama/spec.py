"""Our Llama as the framework sees it: the one place that joins model, plans, init and HF layout."""
from __future__ import annotations

from dataclasses import dataclass

from framework.config.errors import ConfigError
from framework.models.llama import hf_adapter, parallelize
from framework.models.llama.model import Llama, LlamaArgs, TransformerBlock, init_parameter
from framework.models.spec import ModelSpec, model_dict


@dataclass
class LlamaModelConfig(LlamaArgs):
    _target_: str = "framework.models.llama.Llama"


class LlamaSpec(ModelSpec):
    name = "llama"
    init_by_name = True
    supports_pipeline = True
    has_hf_layout = True
    hf_model_type = "llama"

    def config_schema(self) -> type:
        return LlamaModelConfig

    def model_class(self) -> type:
        return Llama

    def args(self, model_cfg):
        return hf_adapter.llama_args(model_dict(model_cfg))

    def init_parameter(self, model_cfg, name, tensor, seed) -> None:
        args = self.args(model_cfg)
        init_parameter(tensor, name, seed, args.n_layers, args.init_std)

    def tied_parameters(self, model_cfg):
        return (("tok_embeddings.weight", "output.weight"),) if self.args(model_cfg).tie_embeddings else ()

    def tensor_parallel_plan(self, model, sequence_parallel):
        return parallelize.tensor_parallel_plan(model, sequence_parallel)

    def num_layers(self, model_cfg) -> int:
        return self.args(model_cfg).n_layers

    def pipeline_stage(self, model, stage_index, num_stages):
        return parallelize.pipeline_stage(model, stage_index, num_stages)

    def block_classes(self, model):
        return (TransformerBlock,)

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
        kv = model.n_kv_heads or model.n_heads
        if model.dim % model.n_heads:
            raise ConfigError("model.dim", f"{model.dim} is not divisible by model.n_heads={model.n_heads}")
        if (model.dim // model.n_heads) % 2:
            raise ConfigError("model.dim", f"head dim {model.dim // model.n_heads} must be even for rotary "
                                           f"embeddings")
        if kv <= 0 or model.n_heads % kv:
            raise ConfigError("model.n_kv_heads", f"{kv} must divide model.n_heads={model.n_heads}")
        if cfg.data.seq_len > model.max_seq_len:
            raise ConfigError("data.seq_len", f"{cfg.data.seq_len} exceeds model.max_seq_len={model.max_seq_len}")
        if cfg.data.vocab_size > model.vocab_size:
            raise ConfigError("model.vocab_size", f"{model.vocab_size} is smaller than the data's vocabulary "
                                                  f"(data.vocab_size={cfg.data.vocab_size})")

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        model = cfg.model
        kv_heads = model.n_kv_heads or model.n_heads
        for key, heads in (("model.n_heads", model.n_heads), ("model.n_kv_heads", kv_heads)):
            if heads % tp:
                raise ConfigError(key, f"{heads} attention heads do not divide among parallel.tp={tp} ranks")

    def hf_config(self, model_cfg) -> dict:
        return hf_adapter.hf_config(self.args(model_cfg))

    def model_cfg_from_hf(self, hf):
        return {"_target_": LlamaModelConfig._target_, "dim": hf["hidden_size"], "n_layers": hf["num_hidden_layers"],
                "n_heads": hf["num_attention_heads"], "n_kv_heads": hf.get("num_key_value_heads"),
                "vocab_size": hf["vocab_size"], "ffn_dim": hf["intermediate_size"],
                "norm_eps": hf.get("rms_norm_eps", 1e-5), "rope_theta": hf.get("rope_theta", 10000.0),
                "max_seq_len": hf["max_position_embeddings"],
                "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}

    def to_hf(self, state, model_cfg):
        return hf_adapter.to_hf(state, self.args(model_cfg))

    def hf_mismatches(self, hf_config, model_cfg):
        return hf_adapter.config_mismatches(hf_config, self.args(model_cfg))

    def hf_weights(self, path, model_cfg):
        return hf_adapter.HFWeights(path, self.args(model_cfg))


SPEC = LlamaSpec()
