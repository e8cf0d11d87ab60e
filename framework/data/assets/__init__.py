"""Data the package ships (a wheel installs it beside the code): `${fw_asset:NAME}` in a config is its path."""
from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The installed path of a shipped data file."""
    return os.path.join(HERE, name)


def jsonl_text(records) -> str:
    """Records as JSON lines, the shipped generated files' format."""
    return "".join(json.dumps(r) + "\n" for r in records)


def write(name: str, text: str) -> None:
    """A generator's `python -m` entry: (re)write the shipped file `name`."""
    with open(path(name), "w", encoding="utf-8") as f:
        f.write(text)
