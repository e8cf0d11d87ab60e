"""`python -m framework.plan [overrides] [--json] [--plot FILE.png]`: the plan of the job those overrides
describe (--plot: also drawn, its per-rank memory and step time, in a PNG).

The config is composed and validated exactly as `python -m framework` would (exit 2 with one line on
a bad one); nothing is launched and no device is needed. Planned for this host's GPU, the job's model is
timed on it (plan/device_timing.py; planner.time_on_device=false models it instead).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework import exit_codes
from framework.compose.config_store import register_configs
from framework.config.derive import derive
from framework.config.paths import CONFIG_DIR
from framework.config.validate import validate
from framework.data.resolve import apply_dataset_manifests
from framework.errors import ConfigError
from framework.plan.check import planned_device, planned_world
from framework.plan.hardware import measured_cpu
from framework.plan.planner import Plan, make_plan
from framework.plan.report import table
from framework.runtime.world import world_size_for
from framework.strategies.registry import strategy_class


def plan_for(overrides: list[str]) -> tuple[Plan, str | None]:
    """The plan of the job (with parallel=auto: of the layout it picks, and the ranking as text)."""
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=overrides)
    OmegaConf.set_struct(cfg, False)
    device = planned_device(cfg) or measured_cpu()
    auto = None
    if cfg.parallel.name == "auto":
        from framework.plan.auto import choose_layout
        world, per_node = planned_world(cfg, world_size_for(cfg, None), device)
        auto, _ = choose_layout(cfg, world, device, per_node, time_on_device=True)
    strategy_cls = strategy_class(cfg.parallel.name)
    apply_dataset_manifests(cfg, model_vocab_given=any(o.startswith("model.vocab_size=") for o in overrides))
    if auto is None:
        world, per_node = planned_world(cfg, world_size_for(cfg, strategy_cls), device)
    derive(cfg, world, strategy_cls)
    validate(cfg, world, strategy_cls)
    return make_plan(cfg, world, device, per_node, time_on_device=True), auto


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    overrides = [a for a in argv if a != "--json"]
    plot_to = None
    if "--plot" in overrides:
        at = overrides.index("--plot")
        if at + 1 >= len(overrides) or "=" in overrides[at + 1]:
            print("error: --plot: give the PNG to write, e.g. --plot plan.png", file=sys.stderr)
            return exit_codes.USAGE
        plot_to = Path(overrides[at + 1])
        del overrides[at:at + 2]
    try:
        plan, auto = plan_for(overrides)
        if plot_to is not None:
            from framework.plan.plot import plot
            plot(plan, plot_to)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.USAGE
    except Exception as e:      # Hydra's own override errors
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
            return exit_codes.USAGE
        raise
    if as_json:
        print(json.dumps(plan.as_json()))
    else:
        print(f"{auto}\n\n{table(plan)}" if auto else table(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
