"""Our GPT-2 as the framework sees it: the one place that joins model, plans, init and HF layout."""
from __future__ import annotations

from dataclasses import dataclass

from framework.errors import ConfigError
from framework.models.gpt2 import hf_adapter
from framework.models.gpt2.model import GPT2, TIED, Block, GPT2Args, init_parameter
from framework.models.native_spec import NativeDecoderSpec


@dataclass
class GPT2ModelConfig(GPT2Args):
    _target_: str = "framework.models.gpt2.GPT2"   # the model class built (the family's)


class GPT2Spec(NativeDecoderSpec):
    name = "gpt2"
    hf_model_type = "gpt2"
    args_class = GPT2Args
    block_class = Block
    init_fn = staticmethod(init_parameter)
    plans = "framework.models.gpt2.parallelize"
    adapter = hf_adapter

    def config_schema(self) -> type:
        return GPT2ModelConfig

    def model_class(self) -> type:
        return GPT2

    def tied_parameters(self, model_cfg):
        return TIED

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        super().validate_layout(cfg, tp, pp)
        if cfg.model.n_heads % tp:
            raise ConfigError("model.n_heads", f"{cfg.model.n_heads} attention heads do not divide among "
                                               f"parallel.tp={tp} ranks")
        if tp > 1 and cfg.parallel.get("sequence_parallel"):
            raise ConfigError("parallel.sequence_parallel", "GPT-2's learned position embeddings are not split "
                                                            "along the sequence; use sequence_parallel=false")

    def model_cfg_from_hf(self, hf):
        return hf_adapter.model_cfg_from_hf(hf, GPT2ModelConfig._target_)


SPEC = GPT2Spec()
