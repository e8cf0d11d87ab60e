"""The options the matrix crosses, read from where the config declares them (never a second list):

- `parallel`: the strategy registry; `zero`, `precision`: the option files of their config groups;
- `model`: the model spec registry, each family at its smallest member (ModelSpec.smallest_overrides);
- every schema field declared with framework.axes.crossed, in the top-level schema and in every group
  option's schema (each strategy's parallel.* options, each family's model.* config).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from framework.axes import KEY
from framework.config.paths import CONFIG_DIR
from framework.config.schema import Config
from framework.models.spec import SPECS, spec_named
from framework.strategies.registry import STRATEGIES, strategy_class

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
            return spec_named(value).smallest_overrides(scratch)
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


def _crossed_fields(schema: type, prefix: str, found: dict[str, tuple]) -> None:
    """Every field of `schema` (and of the dataclasses it holds) marked crossed, looked up through the class
    hierarchy so that a subclass changing a default keeps the mark of the field it overrides."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        marked = next((base.__dataclass_fields__[f.name].metadata[KEY] for base in schema.__mro__
                       if f.name in getattr(base, "__dataclass_fields__", {})
                       and KEY in base.__dataclass_fields__[f.name].metadata), None)
        if marked is not None:      # a list value (trainer.rampup_batch_size) as a tuple: values are hashed
            marked = tuple(tuple(v) if isinstance(v, list) else v for v in marked)
            found[key] = tuple(dict.fromkeys((*found.get(key, ()), *marked)))
        kind = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(kind):
            _crossed_fields(type(kind), key + ".", found)
        elif isinstance(f.type, type) and dataclasses.is_dataclass(f.type):
            _crossed_fields(f.type, key + ".", found)


def _top_level_sections() -> dict[str, type]:
    """Config's sections typed by a dataclass of their own (groups typed Any are read per option below)."""
    import typing
    hints = typing.get_type_hints(Config)
    return {name: hint for name, hint in hints.items() if dataclasses.is_dataclass(hint)}


def discover(scratch: str) -> list[Axis]:
    """The matrix's axes, largest first (the covering set grows with the largest). A model family is one
    where its spec names a smallest member (which may write a file it needs into `scratch`)."""
    fields: dict[str, tuple] = {}
    for name, schema in _top_level_sections().items():
        _crossed_fields(schema, f"{name}.", fields)
    for name in STRATEGIES:
        _crossed_fields(strategy_class(name).options, "parallel.", fields)
    for name in SPECS:
        schema = spec_named(name).config_schema()
        if schema is not None:
            _crossed_fields(schema, "model.", fields)
    axes = [Axis("parallel", tuple(STRATEGIES), is_group=True),
            Axis("model", tuple(n for n in SPECS if spec_named(n).smallest_overrides(scratch)), is_group=True),
            *(Axis(group, _ordered(group), is_group=True) for group in GROUPS),
            *(Axis(key, values) for key, values in sorted(fields.items()))]
    return sorted(axes, key=lambda a: -len(a.values))


def _ordered(group: str) -> tuple[str, ...]:
    """The group's options, the one config.yaml's defaults list picks first."""
    from omegaconf import OmegaConf
    defaults = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "config.yaml").defaults)
    chosen = next((d[group] for d in defaults if isinstance(d, dict) and group in d), None)
    return tuple(sorted(_group_options(group), key=lambda o: (o != chosen, o)))
