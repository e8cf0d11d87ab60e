"""Each rank's random number generators (torch, CUDA, numpy, Python) as tensors in a checkpoint, and back."""
from __future__ import annotations

import json
import random

import numpy as np
import torch

from framework import storage
from framework.checkpoint.unpickle import load_torch


def read_rng(path: str) -> dict:
    """A rank's RNG states as saved (tensors only: anything else is refused)."""
    return load_torch(storage.read_bytes(path), path)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(),
             "numpy": torch.from_numpy(np.frombuffer(json.dumps(_numpy_state()).encode(), dtype=np.uint8).copy()),
             "python": torch.tensor(list(json.dumps(random.getstate()).encode()), dtype=torch.uint8)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _numpy_state() -> list:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), pos, has_gauss, cached]


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = json.loads(bytes(state["numpy"].tolist()).decode())
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = json.loads(bytes(state["python"].tolist()).decode())
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
