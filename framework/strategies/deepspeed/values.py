"""Values at a path of a DeepSpeed JSON: look one up, set one, compare two as DeepSpeed reads them.

A path is a tuple of keys (("zero_optimization", "stage")); MISSING stands for a key the JSON lacks and
AUTO is DeepSpeed's "fill this from the run".
"""
from __future__ import annotations

import copy

AUTO = "auto"
MISSING = object()


def lookup(d: dict, path: tuple[str, ...]):
    """The value at `path`, or MISSING."""
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return MISSING
        d = d[key]
    return d


def put(d: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        d = d.setdefault(key, {})
    d[path[-1]] = value


def same(a, b) -> bool:
    """Equal as settings: 2 == 2.0, "CPU" == "cpu", a bool only equals a bool."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def autos(d, prefix=()) -> list[tuple[str, ...]]:
    """The paths whose value is still "auto"."""
    if d == AUTO:
        return [prefix]
    if isinstance(d, dict):
        return [p for k, v in d.items() for p in autos(v, (*prefix, k))]
    return []


def deep_merge(base: dict, top: dict, none_deletes: bool = False) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if value is None and none_deletes:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, none_deletes)
        else:
            out[key] = copy.deepcopy(value)
    return out
