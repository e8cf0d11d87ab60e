"""Which submodules are a model's repeated blocks: the unit that FSDP shards and activation
checkpointing recomputes.

Blocks are named by class name (`TransformerBlock`) or qualified name (`pkg.mod.TransformerBlock`),
so any `model._target_` can be configured; an empty list means the model's own `block_classes()`.
"""
from __future__ import annotations

from typing import Iterable

from torch import nn


def has_default_blocks(model_cls: type) -> bool:
    return callable(getattr(model_cls, "block_classes", None))


def _matches(module: nn.Module, names: set[str]) -> bool:
    cls = type(module)
    # FSDP2 swaps in a dynamic subclass; the class the user named is then in the MRO.
    return any(c.__name__ in names or f"{c.__module__}.{c.__qualname__}" in names for c in cls.__mro__)


def block_names(model: nn.Module, names: Iterable[str | type] = ()) -> set[str]:
    names = [n if isinstance(n, str) else f"{n.__module__}.{n.__qualname__}" for n in names]
    if not names:
        if not has_default_blocks(type(model)):
            raise ValueError(f"{type(model).__name__} has no block_classes(); name its block classes in the config")
        names = [f"{c.__module__}.{c.__qualname__}" for c in model.block_classes()]
    return set(names)


def find_blocks(model: nn.Module, names: Iterable[str | type] = ()) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every block, in forward order (module registration order)."""
    wanted = block_names(model, names)
    found = [(name, m) for name, m in model.named_modules() if m is not model and _matches(m, wanted)]
    if not found:
        raise ValueError(f"no submodule of {type(model).__name__} is a {' or '.join(sorted(wanted))}")
    return found
