"""Data the package ships (a wheel installs it beside the code): `${fw_asset:NAME}` in a config is its path."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The installed path of a shipped data file."""
    return os.path.join(HERE, name)
