"""The options the matrix crosses: the groups from their registries and option files (never a second list), the
fields and model families from tests/matrix/crossed.py:

- `parallel`: the strategy registry; `zero`, `precision`: the option files of their config groups;
- `model`: the model spec registry, each family at its smallest member (crossed.SMALLEST);
- `objective`: the objective registry, each with the data it trains on (crossed.objective_overrides), less those
  crossed.OBJECTIVES_NOT_CROSSED says why not;
- every field of crossed.CROSSED, whose first value is what a job gets where the matrix does not set it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from framework.config.paths import CONFIG_DIR
from framework.models.spec import SPECS
from framework.objectives.registry import DEFAULT as DEFAULT_OBJECTIVE
from framework.objectives.registry import OBJECTIVES
from framework.strategies.registry import STRATEGIES
from tests.matrix.crossed import CROSSED, OBJECTIVES_NOT_CROSSED, SMALLEST, objective_overrides, smallest_overrides

#: config groups crossed by their option files
GROUPS = ("zero", "precision")


@dataclass(frozen=True)
class Axis:
    key: str                        # "parallel" (a group or registry) or a dotted field, "parallel.tp"
    values: tuple                   # the first is what a job gets when the matrix does not set this axis
    is_group: bool = False

    def overrides(self, value, scratch: str) -> list[str]:
        """The command-line overrides that give this axis `value`."""
        if self.key == "model":
            return smallest_overrides(value, scratch)
        if self.key == "objective":
            return objective_overrides(value, scratch)
        if self.is_group:
            return [f"{self.key}={value}"]
        return [f"{self.key}={_yaml(value)}"]


def _yaml(value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_yaml(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _group_options(group: str) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml")))


def discover(scratch: str) -> list[Axis]:
    """The matrix's axes, largest first (the covering set grows with the largest). `scratch`: where a family's
    smallest member may write a file it needs."""
    axes = [Axis("parallel", tuple(STRATEGIES), is_group=True),
            Axis("model", tuple(n for n in SPECS if n in SMALLEST), is_group=True),
            Axis("objective", tuple(sorted((o for o in OBJECTIVES if o not in OBJECTIVES_NOT_CROSSED),
                                           key=lambda o: (o != DEFAULT_OBJECTIVE, o))), is_group=True),
            *(Axis(group, _ordered(group), is_group=True) for group in GROUPS),
            *(Axis(key, values) for key, values in sorted(CROSSED.items()))]
    return sorted(axes, key=lambda a: -len(a.values))


def _ordered(group: str) -> tuple[str, ...]:
    """The group's options, the one config.yaml's defaults list picks first."""
    from omegaconf import OmegaConf
    defaults = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "config.yaml").defaults)
    chosen = next((d[group] for d in defaults if isinstance(d, dict) and group in d), None)
    return tuple(sorted(_group_options(group), key=lambda o: (o != chosen, o)))
