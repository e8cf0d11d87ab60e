"""What the user chose explicitly: the command line's overrides and the keys of any recipe it applies.

A value the user left at our default may be replaced by one fixed in a file they bring (a DeepSpeed
JSON); an explicit choice never is. Read in the launching process, from Hydra's record of the overrides.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from framework.config.paths import RECIPE_DIR


def _flatten(node, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return {prefix}
    keys = {prefix} if prefix else set()
    for key, value in node.items():
        keys |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return keys


def recipe_keys(name: str) -> set[str]:
    """Group choices (`override /zero: stage3` -> zero) and dotted keys a recipe sets."""
    path = RECIPE_DIR / f"{name}.yaml"
    if not path.is_file():
        return set()
    recipe = OmegaConf.to_container(OmegaConf.load(path))
    keys = set()
    for entry in recipe.pop("defaults", []) or []:
        if isinstance(entry, dict):
            keys |= {k.replace("override ", "").strip().lstrip("/") for k in entry}
    return keys | _flatten(recipe)


def explicit_keys(overrides: list[str]) -> set[str]:
    """`zero=stage2` -> {"zero"}, `+trainer.max_steps=3` -> {"trainer.max_steps"}, `+recipe=x` -> its keys."""
    keys = set()
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        keys.add(key)
        if key == "recipe":
            keys |= recipe_keys(value)
    return keys


def hydra_explicit_keys() -> set[str]:
    """The explicit keys of the running Hydra app; empty outside one (a config composed in a test)."""
    from hydra.core.hydra_config import HydraConfig
    if not HydraConfig.initialized():
        return set()
    return explicit_keys(list(HydraConfig.get().overrides.task))


def is_explicit(key: str, explicit: set[str], group_picks_it: bool = False) -> bool:
    """`key` was set by the user; with group_picks_it, choosing its group (`zero=stage2` for zero.stage) counts."""
    return key in explicit or (group_picks_it and key.split(".")[0] in explicit)
