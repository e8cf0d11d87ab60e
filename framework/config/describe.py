"""What a config key is, read from the dataclass that declares it: type, default, allowed values and
meaning. `python -m framework --help` and the generated reference (docs/reference/config.md) both print
these rows, so they say the same thing.

A field's meaning is the comment beside it in its dataclass (the trailing comment on its line, or else the
first sentence of the comment block just above it): the schema stays the one place a key is described.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from omegaconf import MISSING

from framework.config.choices import allowed_values


@dataclass(frozen=True)
class KeyDoc:
    key: str            # dotted, from the config's root
    type: str           # int, float or null, list[str], ...
    default: str        # as a command line would write it; "???" = required
    allowed: str        # the values a choice field takes; "" for any of its type
    meaning: str


def describe(schema: type, prefix: str = "", names: tuple[str, ...] | None = None) -> list[KeyDoc]:
    """One row per leaf key of `schema` (of its fields `names` only, if given); nested dataclasses are
    opened, and a list of dataclasses gets rows for its entries' keys as `<key>[].<field>`."""
    hints = typing.get_type_hints(schema, include_extras=True)
    rows = []
    for f in dataclasses.fields(schema):
        if names is not None and f.name not in names:
            continue
        hint, key = hints[f.name], f"{prefix}{f.name}"
        nested = _dataclass_in(hint)
        if nested is not None and not _is_list(hint):
            rows += describe(nested, f"{key}.")
            continue
        rows.append(KeyDoc(key, type_name(hint), render(default_of(f)), _allowed(hint),
                           meaning_of(schema, f.name)))
        if nested is not None:
            rows += describe(nested, f"{key}[].")
    return rows


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def render(value: Any) -> str:
    """A value as it is written on the command line (`???`: required, no default)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if value else '""'
    if dataclasses.is_dataclass(value):
        return render(dataclasses.asdict(value))
    return str(value)


def type_name(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin in (list, tuple):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict or hint is dict:
        return "dict"
    if hint is Any:
        return "any"
    if dataclasses.is_dataclass(hint):
        return "{" + ", ".join(f.name for f in dataclasses.fields(hint)) + "}"
    return getattr(hint, "__name__", str(hint))


def _allowed(hint) -> str:
    values = allowed_values(hint)
    return ", ".join(render(v) for v in values) if values else ""


def _is_list(hint) -> bool:
    return typing.get_origin(hint) in (list, tuple)


def _dataclass_in(hint) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    if _is_list(hint):
        args = typing.get_args(hint)
        return args[0] if args and dataclasses.is_dataclass(args[0]) else None
    return None


def meaning_of(schema: type, name: str) -> str:
    """The comment on `name` in the nearest class of `schema`'s MRO that declares it with one."""
    for cls in schema.__mro__:
        said = _field_comments(cls).get(name)
        if said:
            return said
    return ""


@lru_cache(maxsize=None)
def _field_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments = {tok.start[0]: tok.string.lstrip("#:").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = [comments[n] for n in range(node.lineno, node.end_lineno + 1)
                    if n in comments and not lines[n - 1].lstrip().startswith("#")]
        if trailing:
            out[node.target.id] = trailing[0]
            continue
        above, n = [], node.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        if above:
            out[node.target.id] = _first_sentence(" ".join(above))
    return out


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=\.)\s+(?=[A-Z])", text, maxsplit=1)[0]
