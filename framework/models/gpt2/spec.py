"""Our GPT-2 as the framework sees it: the one place that joins model, plans, init and HF layout."""
from __future__ import annotations

from dataclasses import dataclass

from framework.config.errors import ConfigError
from framework.models.gpt2 import hf_adapter, parallelize
from framework.models.gpt2.model import GPT2, TIED, Block, GPT2Args, init_parameter
from framework.models.spec import ModelSpec, model_dict


@dataclass
class GPT2ModelConfig(GPT2Args):
    _target_: str = "framework.models.gpt2.GPT2"


class GPT2Spec(ModelSpec):
    name = "gpt2"
    init_by_name = True
    supports_pipeline = True
    has_hf_layout = True
    hf_model_type = "gpt2"

    def config_schema(self) -> type:
        return GPT2ModelConfig

    def model_class(self) -> type:
        return GPT2

    def args(self, model_cfg) -> GPT2Args:
        return hf_adapter.gpt2_args(model_dict(model_cfg))

    def init_parameter(self, model_cfg, name, tensor, seed) -> None:
        args = self.args(model_cfg)
        init_parameter(tensor, name, seed, args.n_layers, args.init_std)

    def tied_parameters(self, model_cfg):
        return TIED

    def tensor_parallel_plan(self, model, sequence_parallel):
        return parallelize.tensor_parallel_plan(model)

    def num_layers(self, model_cfg) -> int:
        return self.args(model_cfg).n_layers

    def pipeline_stage(self, model, stage_index, num_stages):
        return parallelize.pipeline_stage(model, stage_index, num_stages)

    def block_classes(self, model):
        return (Block,)

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
            raise ConfigError("data.seq_len", f"{cfg.data.seq_len} exceeds model.max_seq_len={model.max_seq_len} "
                                              f"(the learned position embeddings)")
        if cfg.data.vocab_size > model.vocab_size:
            raise ConfigError("model.vocab_size", f"{model.vocab_size} is smaller than the data's vocabulary "
                                                  f"(data.vocab_size={cfg.data.vocab_size})")

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        if cfg.model.n_heads % tp:
            raise ConfigError("model.n_heads", f"{cfg.model.n_heads} attention heads do not divide among "
                                               f"parallel.tp={tp} ranks")
        if tp > 1 and cfg.parallel.get("sequence_parallel"):
            raise ConfigError("parallel.sequence_parallel", "GPT-2's learned position embeddings are not split "
                                                            "along the sequence; use sequence_parallel=false")

    def hf_config(self, model_cfg) -> dict:
        return hf_adapter.hf_config(self.args(model_cfg))

    def model_cfg_from_hf(self, hf):
        return hf_adapter.model_cfg_from_hf(hf, GPT2ModelConfig._target_)

    def to_hf(self, state, model_cfg):
        return hf_adapter.to_hf(state, self.args(model_cfg))

    def hf_mismatches(self, hf_config, model_cfg):
        return hf_adapter.config_mismatches(hf_config, self.args(model_cfg))

    def hf_weights(self, path, model_cfg):
        return hf_adapter.HFWeights(path, self.args(model_cfg))


SPEC = GPT2Spec()
