"""parallel.name -> strategy. Adding a strategy: one file (its traits class and its runtime class), one line here,
one yaml. The launcher, validation and the planner (framework/plan) get the traits class only (`strategy_class`:
what it shards and keeps, framework/strategies/traits.py), so a new strategy needs no planner edit; the worker gets
the runtime class (`strategy_runtime`)."""
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


def strategy_runtime(name: str):
    """The class a worker builds (framework.strategies.runtime.Strategy): the registered one."""
    if name not in STRATEGIES:
        raise ConfigError("parallel", f"unknown strategy {name!r}; available: {', '.join(STRATEGIES)}")
    module, cls = STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def strategy_class(name: str):
    """Its traits class (framework.strategies.traits.StrategyTraits): the class-level declarations and `validate`
    alone, what the launcher, validation and the planner read; the registered class where it is traits only."""
    return traits_of(strategy_runtime(name))


def traits_of(cls):
    """The first class of `cls` and its bases that is no runtime (has no `forward_backward`, the method every
    runtime.Strategy defines; found by name, so the registry imports no runtime): a strategy file's traits class."""
    return next(c for c in cls.__mro__ if not hasattr(c, "forward_backward"))


def all_strategy_classes():
    """parallel.name -> traits class, for every registered strategy."""
    return {name: strategy_class(name) for name in STRATEGIES}
