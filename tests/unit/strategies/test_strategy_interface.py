"""The worker-side interface (framework/strategies/runtime.py) says what a strategy must define with
abc.abstractmethod: a strategy that leaves one out cannot be built, and every registered strategy defines all."""
import inspect

import pytest

from framework.strategies.registry import STRATEGIES, all_strategy_classes, strategy_runtime
from framework.strategies.runtime import Strategy
from framework.strategies.traits import StrategyTraits


def test_every_registered_strategy_defines_the_whole_runtime_and_declares_traits():
    for name in STRATEGIES:
        cls = strategy_runtime(name)
        assert not inspect.isabstract(cls), f"parallel={name} leaves {sorted(cls.__abstractmethods__)} undefined"
        assert issubclass(cls, StrategyTraits) and cls.name == name


def test_the_launcher_and_the_planner_get_a_strategys_traits_and_the_worker_its_runtime():
    for name, traits in all_strategy_classes().items():
        runtime = strategy_runtime(name)
        assert issubclass(runtime, traits) and issubclass(runtime, Strategy), name
        assert issubclass(traits, StrategyTraits) and not issubclass(traits, Strategy), name
        assert traits.name == name and not hasattr(traits, "forward_backward"), name


def test_a_strategy_that_leaves_out_a_required_method_cannot_be_built():
    class HalfStrategy(Strategy):
        name = "half"

        def setup(self, build_model, build_optimizer, build_scheduler):
            pass

    with pytest.raises(TypeError, match="forward_backward"):
        HalfStrategy(None)
    assert set(Strategy.__abstractmethods__) == {"setup", "forward_backward", "optimizer_step", "eval_loss",
                                                 "save_checkpoint", "load_checkpoint"}
