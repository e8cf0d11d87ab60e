"""Objective name -> "module:class". Adding an objective: one module under framework/objectives/ and one line
here (or `register` at runtime). Class paths are strings, imported only when the objective is chosen. Jobs train
`lm` (issue 60 adds the config group that picks another)."""
from __future__ import annotations

import importlib

from framework.errors import ConfigError
from framework.objectives.base import Objective

OBJECTIVES: dict[str, str] = {
    "lm": "framework.objectives.lm:NextTokenCrossEntropy",
}

#: what every job trains until the `objective` config group exists
DEFAULT = "lm"


def register(name: str, path: str) -> None:
    """Another objective under `name` (a plugin or a test): `path` is "module:class"."""
    OBJECTIVES[name] = path


def objective_named(name: str = DEFAULT) -> Objective:
    if name not in OBJECTIVES:
        raise ConfigError("objective", f"unknown objective {name!r}; available: {', '.join(OBJECTIVES)}")
    module, cls = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), cls)()
