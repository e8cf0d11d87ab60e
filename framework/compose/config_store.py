"""Puts the schemas in Hydra's ConfigStore under schema/<group>/, where the yaml files in conf/ name them
(`- /schema/parallel/ddp@_here_`); kept out of the groups themselves so they are not listed as options."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from framework.config import schema
from framework.data import assets


def register_configs() -> None:
    from framework.models.spec import SPECS, spec_named
    from framework.objectives.registry import OBJECTIVES, objective_class
    from framework.strategies.registry import all_strategy_classes

    # `${fw_asset:NAME}`: a data file the package ships (recipes sft_tiny, lora_tiny), wherever it is installed
    OmegaConf.register_new_resolver("fw_asset", assets.path, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=schema.Config)
    for name, cls in all_strategy_classes().items():
        cs.store(group="schema/parallel", name=name, node=cls.options)
    cs.store(group="schema/parallel", name="auto", node=schema.AutoParallelConfig)
    cs.store(group="schema/zero", name="zero", node=schema.ZeroConfig)
    cs.store(group="schema/precision", name="precision", node=schema.PrecisionConfig)
    cs.store(group="schema/activation_checkpointing", name="ac", node=schema.ActivationCheckpointingConfig)
    for name in SPECS:
        cs.store(group="schema/model", name=name, node=spec_named(name).config_schema())
    cs.store(group="schema/optimizer", name="adamw", node=schema.AdamWConfig)
    cs.store(group="schema/optimizer", name="sgd", node=schema.SGDConfig)
    cs.store(group="schema/optimizer", name="muon", node=schema.MuonConfig)
    cs.store(group="schema/optimizer", name="lowbit", node=schema.LowBitAdamWConfig)
    cs.store(group="schema/optimizer", name="bf16", node=schema.BF16AdamWConfig)
    cs.store(group="schema/scheduler", name="scheduler", node=schema.SchedulerConfig)
    cs.store(group="schema/scheduler", name="wsd", node=schema.WSDConfig)
    cs.store(group="schema/data", name="data", node=schema.DataConfig)
    for name in OBJECTIVES:
        cs.store(group="schema/objective", name=name, node=objective_class(name).options)
    _sweeper_defaults(cs)


def _sweeper_defaults(cs: ConfigStore) -> None:
    """hydra/sweeper=optuna records a failed or invalid trial as failed and goes on (the plugin's default
    stops the study at the first). Hydra scans its plugins once, re-running their registrations: after that
    scan, ours stays."""
    from hydra.core.plugins import Plugins
    Plugins.instance()
    try:
        from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
    except ImportError:     # the `sweep` extra is not installed
        return
    cs.store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf(max_failure_rate=1.0),
             provider="optuna_sweeper")
