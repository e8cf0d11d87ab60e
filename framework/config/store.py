"""Puts the schemas in Hydra's ConfigStore, where the yaml files in conf/ name them."""
from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from framework.config import schema
from framework.models.llama import LlamaArgs


@dataclass
class LlamaModelConfig(LlamaArgs):
    _target_: str = "framework.models.llama.Llama"


def register_configs() -> None:
    from framework.strategies.registry import all_strategy_classes

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=schema.Config)
    for name, cls in all_strategy_classes().items():
        cs.store(group="parallel", name=f"{name}_schema", node=cls.options)
    cs.store(group="zero", name="zero_schema", node=schema.ZeroConfig)
    cs.store(group="precision", name="precision_schema", node=schema.PrecisionConfig)
    cs.store(group="activation_checkpointing", name="ac_schema", node=schema.ActivationCheckpointingConfig)
    cs.store(group="model", name="llama_schema", node=LlamaModelConfig)
    cs.store(group="optimizer", name="adamw_schema", node=schema.AdamWConfig)
    cs.store(group="optimizer", name="sgd_schema", node=schema.SGDConfig)
    cs.store(group="scheduler", name="scheduler_schema", node=schema.SchedulerConfig)
    cs.store(group="data", name="data_schema", node=schema.DataConfig)
