"""The values derived once a job's strategy and world size are known, in order, written into the config so that
the resolved config.yaml shows what ran: admission's part of its ordered list (framework/launch/admission.py `admit`
runs `derive` after the layout, the dataset's facts and the world size, and before the config is made read-only
and validated), which the plan and k8s commands and the planner's trial copies reuse. Each derivation is a named
function here; validation (validate.py) writes nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from framework.checkpoint.rules import take_initial_load_values
from framework.config.explicit import hydra_explicit_keys
from framework.config.validate import check_keys
from framework.data.rules import document_mask

if TYPE_CHECKING:
    from framework.config.schema import Config


def derive(cfg: Config, world_size: int, strategy_cls, explicit: set[str] | None = None) -> None:
    """The values derived once the strategy and the world are known, in order, written into cfg. Whatever validates
    a config calls this first: admission, the plan and k8s commands, the planner's trial copies (each into its own
    copy). The checks these derivations read through come first, in validation's own order, so that a config
    with several mistakes is told the same first one."""
    explicit = hydra_explicit_keys() if explicit is None else explicit
    check_keys(cfg)                    # the derivations read complete, known keys
    derive_deepspeed_adoption(cfg, world_size, strategy_cls, explicit)
    strategy_cls.check_world(cfg, world_size)     # the micro batch is derived for a world the strategy takes
    derive_micro_batch(cfg, world_size, strategy_cls)
    derive_data_packing(cfg)
    derive_initial_load_values(cfg, explicit)


def derive_deepspeed_adoption(cfg: Config, world_size: int, strategy_cls, explicit: set[str]) -> None:
    """What a user's DeepSpeed JSON (parallel.ds_config) fixes where the user left our default."""
    strategy_cls.adopt_user_files(cfg, world_size, explicit)


def derive_micro_batch(cfg: Config, world_size: int, strategy_cls) -> None:
    """An unset trainer.micro_batch_size, filled in from the batch layout so that the saved config shows it."""
    cfg.trainer.micro_batch_size = strategy_cls.batch_layout(cfg, world_size).micro_batch


def derive_data_packing(cfg: Config) -> None:
    """data.document_mask as it applies (false with one example a row: framework.data.rules.document_mask)."""
    cfg.data.document_mask = document_mask(cfg.data)


def derive_initial_load_values(cfg: Config, explicit: set[str]) -> None:
    """The function values (norm epsilon, RoPE) checkpoint.initial_load's config.json gives the model."""
    take_initial_load_values(cfg, explicit)
