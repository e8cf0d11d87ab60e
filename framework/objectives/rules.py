"""The objective's rules, in validation's order (framework/config/validate.py): what it trains on, and where its
reference model comes from."""
from __future__ import annotations

from framework.data.sources import source_of
from framework.errors import ConfigError
from framework.objectives.registry import DEFAULT, OBJECTIVES, objective_class


def pair_objectives() -> list[str]:
    """`objective=<name>` of every objective that trains on chosen/rejected pairs."""
    return [f"objective={n}" for n in OBJECTIVES if objective_class(n).rows_per_example == 2]


def validate_objective(cfg, frozen_reference: bool, strategy: str) -> None:
    """`frozen_reference`: whether the job's strategy builds a frozen copy of the model (its traits')."""
    options = cfg.get("objective")
    name = options.name if options is not None else DEFAULT
    objective = objective_class(name)
    pairs = getattr(source_of(cfg.data), "pairs", False)
    if objective.rows_per_example == 2 and not pairs:
        raise ConfigError("objective", f"objective={name} trains on chosen/rejected pairs; data.source="
                                       f"{cfg.data.source} holds none: use data=preference")
    if pairs and objective.rows_per_example != 2:
        raise ConfigError("data.source", f"data=preference holds chosen/rejected pairs, which objective={name} "
                                         f"does not train on; use {' or '.join(pair_objectives())}")
    if not pairs:
        return
    if cfg.data.packing:
        raise ConfigError("data.packing", "preference objectives score each chosen and rejected sequence whole, one "
                                          "a row (TRL packs no preference data either); set data.packing=false")
    if cfg.data.max_prompt_length is not None and cfg.data.max_prompt_length <= 0:
        raise ConfigError("data.max_prompt_length", f"must be positive (or null: no limit), got "
                                                    f"{cfg.data.max_prompt_length}")
    if options.beta <= 0:
        raise ConfigError("objective.beta", f"must be positive, got {options.beta}")
    if not 0 <= options.get("label_smoothing", 0.0) < 0.5:
        raise ConfigError("objective.label_smoothing", f"must be in [0, 0.5), got {options.label_smoothing}")
    if options.get("precompute_reference") and not objective.needs_reference:
        raise ConfigError("objective.precompute_reference", f"objective={name} reads no reference model, so there "
                                                            f"is nothing to precompute; leave it false")
    if objective.needs_reference and not cfg.lora.enabled and not frozen_reference \
            and not options.get("precompute_reference"):
        raise ConfigError("objective", f"objective={name} needs a reference model, and parallel={strategy} builds "
                                       f"no frozen copy of the model; train LoRA adapters (lora.enabled=true: the "
                                       f"reference is the base with them off), score the pairs once before "
                                       f"training (objective.precompute_reference=true) or shard with parallel=fsdp")
