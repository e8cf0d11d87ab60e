"""Our Llama as the framework sees it: the one place that joins model, plans, init and HF layout."""
from __future__ import annotations

from dataclasses import dataclass

from framework.errors import ConfigError
from framework.models.llama import hf_adapter
from framework.models.llama.model import (ROPE_SCALING_KEYS, ROPE_TYPES, Llama, LlamaArgs, TransformerBlock,
                                          init_parameter, rope_scaling_dict)
from framework.models.native_spec import NativeDecoderSpec


@dataclass
class LlamaModelConfig(LlamaArgs):
    _target_: str = "framework.models.llama.Llama"   # the model class built (the family's)


def validate_rope_scaling(scaling) -> None:
    scaling = rope_scaling_dict(scaling)
    key = "model.rope_scaling"
    if scaling["rope_type"] not in ROPE_TYPES:
        raise ConfigError(f"{key}.rope_type", f"{scaling['rope_type']!r} is not implemented; use "
                                              f"{' or '.join(ROPE_TYPES)}")
    if scaling["rope_type"] == "default":
        return
    for k in ROPE_SCALING_KEYS:
        if not isinstance(scaling[k], (int, float)) or scaling[k] <= 0:
            raise ConfigError(f"{key}.{k}", f"must be a positive number, got {scaling[k]}")
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ConfigError(f"{key}.high_freq_factor", f"{scaling['high_freq_factor']} must exceed "
                                                     f"low_freq_factor={scaling['low_freq_factor']}")


class LlamaSpec(NativeDecoderSpec):
    name = "llama"
    hf_model_type = "llama"
    args_class = LlamaArgs
    block_class = TransformerBlock
    init_fn = staticmethod(init_parameter)
    plans = "framework.models.llama.parallelize"
    adapter = hf_adapter

    def config_schema(self) -> type:
        return LlamaModelConfig

    def model_class(self) -> type:
        return Llama

    def output_heads(self) -> tuple[str, ...]:
        return ("output",)

    def tied_parameters(self, model_cfg):
        return (("tok_embeddings.weight", "output.weight"),) if self.args(model_cfg).tie_embeddings else ()

    def validate(self, cfg) -> None:
        super().validate(cfg)
        model = cfg.model
        kv = model.n_kv_heads or model.n_heads
        if (model.dim // model.n_heads) % 2:
            raise ConfigError("model.dim", f"head dim {model.dim // model.n_heads} must be even for rotary "
                                           f"embeddings")
        if kv <= 0 or model.n_heads % kv:
            raise ConfigError("model.n_kv_heads", f"{kv} must divide model.n_heads={model.n_heads}")
        validate_rope_scaling(model.get("rope_scaling"))

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        super().validate_layout(cfg, tp, pp)
        model = cfg.model
        kv_heads = model.n_kv_heads or model.n_heads
        for key, heads in (("model.n_heads", model.n_heads), ("model.n_kv_heads", kv_heads)):
            if heads % tp:
                raise ConfigError(key, f"{heads} attention heads do not divide among parallel.tp={tp} ranks")

    def model_cfg_from_hf(self, hf):
        theta, scaling = hf_adapter.rope_of(hf)
        return {"_target_": LlamaModelConfig._target_, "dim": hf["hidden_size"], "n_layers": hf["num_hidden_layers"],
                "n_heads": hf["num_attention_heads"], "n_kv_heads": hf.get("num_key_value_heads"),
                "vocab_size": hf["vocab_size"], "ffn_dim": hf["intermediate_size"],
                "norm_eps": hf.get("rms_norm_eps", 1e-6), "rope_theta": theta, "rope_scaling": scaling,
                "max_seq_len": hf["max_position_embeddings"],
                "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


SPEC = LlamaSpec()
