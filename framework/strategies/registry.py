"""parallel.name -> Strategy class. Adding a strategy: one file, one line here, one yaml. The planner
(framework/plan) reaches a strategy only through here and reads what it shards and keeps from the class
(its traits: framework/strategies/traits.py), so a new strategy needs no planner edit."""
from __future__ import annotations

import importlib

from framework.errors import ConfigError

#: in the order parallel=auto tries them (of equally fast layouts of equal machinery, the first listed wins)
STRATEGIES: dict[str, str] = {
    "single": "framework.strategies.single:SingleDeviceStrategy",
    "ddp": "framework.strategies.ddp:DDPStrategy",
    "fsdp": "framework.strategies.fsdp:FSDPStrategy",
    "deepspeed": "framework.strategies.deepspeed:DeepSpeedStrategy",
    "3d": "framework.strategies.parallel3d:Parallel3DStrategy",
}


def register(name: str, path: str) -> None:
    """Another strategy under `name` (a plugin or a test): `path` is "module:class"."""
    STRATEGIES[name] = path


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def strategy_class(name: str):
    if name not in STRATEGIES:
        raise ConfigError("parallel", f"unknown strategy {name!r}; available: {', '.join(STRATEGIES)}")
    module, cls = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def all_strategy_classes():
    return {name: strategy_class(name) for name in STRATEGIES}
