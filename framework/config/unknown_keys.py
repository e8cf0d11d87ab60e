"""Keys no schema declares. Hydra's `+key=value` adds keys even to structured configs, so a typo such as
`+trainer.max_step=10` would compose and be silently ignored; this walk refuses it, naming the closest key."""
from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError


def _free_form(schema, node: DictConfig) -> bool:
    """A class of the user's own (model=custom, or a _target_ other than the schema's) takes any keys."""
    default = {f.name: f.default for f in dataclasses.fields(schema)}.get("_target_")
    return default is not None and node.get("_target_") != default


def unknown_keys(node: DictConfig, path: str = "") -> list[tuple[str, list[str]]]:
    """(dotted key, the keys its schema does declare) for every key that no schema declares."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema) or _free_form(schema, node):
        return []
    declared = [f.name for f in dataclasses.fields(schema)]
    found = []
    for key in node.keys():
        full = f"{path}.{key}" if path else str(key)
        if key not in declared:
            found.append((full, declared))
        elif isinstance(node._get_node(key), DictConfig) and not OmegaConf.is_missing(node, key):
            found += unknown_keys(node[key], full)
    return found


def refuse_unknown_keys(cfg: DictConfig) -> None:
    found = unknown_keys(cfg)
    if not found:
        return
    key, declared = found[0]
    parent, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, declared, n=1)
    hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?" if close else \
        f"{parent or 'the top level'} has {', '.join(declared)}"
    raise ConfigError(key, f"no such key; {hint}")
