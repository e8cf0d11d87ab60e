"""Choice fields (`OneOf[...]` in a schema dataclass): every value outside its set is refused with
`<key>: '<value>' is not one of a|b|c`. The fields are found on the composed config itself, so a
strategy's own schema (beside its strategy) is covered as soon as it declares one."""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError


class Registered:
    """The names of a registry (name -> what implements it), read each time they are asked for."""

    def __init__(self, registry: dict):
        self.registry = registry

    def names(self) -> tuple:
        return tuple(self.registry)


def allowed_values(annotation) -> tuple | None:
    """The values a OneOf annotation allows (None also, when it is Optional); None for any other type."""
    if typing.get_origin(annotation) is typing.Union:
        inner = [allowed_values(a) for a in typing.get_args(annotation) if a is not type(None)]
        return (*inner[0], None) if len(inner) == 1 and inner[0] else None
    if typing.get_origin(annotation) is typing.Annotated:
        registered = [m for m in annotation.__metadata__ if isinstance(m, Registered)]
        if registered:
            return registered[0].names()
        literals = [m for m in annotation.__metadata__ if typing.get_origin(m) is typing.Literal]
        return typing.get_args(literals[0]) if literals else None
    return None


def choice_fields(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, tuple]]:
    """(dotted key, allowed values) of every choice field in `cfg`, nested nodes included."""
    schema = OmegaConf.get_type(cfg)
    hints = typing.get_type_hints(schema, include_extras=True) if dataclasses.is_dataclass(schema) else {}
    for key in cfg.keys():
        allowed = allowed_values(hints[key]) if key in hints else None
        if allowed is not None:
            yield f"{prefix}{key}", allowed
        elif OmegaConf.is_dict(cfg._get_node(key)) and not OmegaConf.is_missing(cfg, key):
            yield from choice_fields(cfg[key], f"{prefix}{key}.")


def check_choices(cfg: DictConfig) -> None:
    for key, allowed in choice_fields(cfg):
        value = OmegaConf.select(cfg, key)
        if value not in allowed and not OmegaConf.is_missing(cfg, key):
            shown = "|".join("null" if a is None else str(a) for a in allowed)
            raise ConfigError(key, f"{value!r} is not one of {shown}")
