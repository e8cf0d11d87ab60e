"""Marks the schema fields that the combination matrix (tests/matrix) crosses with every other option.

Group options (parallel=, zero=, precision=, activation_checkpointing=, model families) are crossed without
marking. A field that changes how a job trains is declared with `crossed(default, *tried)`: the matrix then
runs each of `tried` beside every other option, with no test edit, and a test fails if one is never run.
"""
from dataclasses import field

KEY = "crossed"


def crossed(default, *tried):
    """A dataclass field with `default`, which the combination matrix also tries at each of `tried`."""
    return field(default=default, metadata={KEY: (default, *tried)})
