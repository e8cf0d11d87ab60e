"""Objective name -> "module:class". Adding an objective: one module under framework/objectives/ and one line
here (or `register` at runtime). Class paths are strings, imported only when the objective is chosen. Jobs train
`lm` unless the `objective` config group (conf/objective/) picks another."""
from __future__ import annotations

import importlib

from framework.errors import ConfigError
from framework.objectives.base import Objective

OBJECTIVES: dict[str, str] = {
    "lm": "framework.objectives.lm:NextTokenCrossEntropy",
    "dpo": "framework.objectives.dpo:DPO",
    "simpo": "framework.objectives.simpo:SimPO",
    "orpo": "framework.objectives.orpo:ORPO",
}

#: what a job trains when its config names no objective (conf/config.yaml's default, and a config saved before
#: the `objective` group existed)
DEFAULT = "lm"


def register(name: str, path: str) -> None:
    """Another objective under `name` (a plugin or a test): `path` is "module:class"."""
    OBJECTIVES[name] = path


def objective_class(name: str = DEFAULT) -> type[Objective]:
    if name not in OBJECTIVES:
        raise ConfigError("objective", f"unknown objective {name!r}; available: {', '.join(OBJECTIVES)}")
    module, cls = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def objective_named(name: str = DEFAULT, options=None) -> Objective:
    return objective_class(name)(options)


def class_of(cfg) -> type[Objective]:
    """The job's objective's class (what the planner and validation read)."""
    options = cfg.get("objective")
    return objective_class(options.name if options is not None else DEFAULT)


def objective_of(cfg) -> Objective:
    """The job's objective, built with its `objective.*` keys."""
    return class_of(cfg)(cfg.get("objective"))


def frozen_reference(cfg) -> bool:
    """Whether the job holds a frozen copy of the model as its objective's reference through training (no LoRA to
    switch off, no table of log-probs computed before training)."""
    return class_of(cfg).needs_reference and not cfg.lora.enabled and not precomputed_reference(cfg)


def precomputed_reference(cfg) -> bool:
    """Whether the reference's log-probs are computed once, before training (objective.precompute_reference)."""
    options = cfg.get("objective")
    return options is not None and class_of(cfg).needs_reference and bool(options.get("precompute_reference", False))
