"""Forwards run only to learn shapes. torch's pipeline stages run one before their first step (the first
stage on the real batch, later stages on uninitialised placeholders); a model that keeps statistics of
its forwards (the MoE layers' expert loads) counts none of them."""
from __future__ import annotations

import contextlib

_depth = [0]


@contextlib.contextmanager
def inferring_shapes():
    """Within: the forwards that run are for shapes alone."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


def inferring() -> bool:
    return _depth[0] > 0
