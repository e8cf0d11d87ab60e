"""The files of a Hugging Face model directory, as every model family's adapter reads and writes them.

Weights come as one `model.safetensors` or, past transformers' shard size, as
`model-0000k-of-0000n.safetensors` files named by `model.safetensors.index.json`'s weight_map;
`SafetensorsDir` reads either, one tensor (or one slice of it) at a time.
"""
from __future__ import annotations

import json
import os

WEIGHTS, CONFIG = "model.safetensors", "config.json"
INDEX = WEIGHTS + ".index.json"


def read_config(path: str) -> dict:
    with open(os.path.join(path, CONFIG)) as f:
        return json.load(f)


def has_weights(path: str) -> bool:
    return os.path.isfile(os.path.join(path, WEIGHTS)) or os.path.isfile(os.path.join(path, INDEX))


class LayoutError(ValueError):
    """Weights that do not fit the model (an unknown name or a wrong shape)."""


class SafetensorsDir:
    """The tensors of a model dir, single-file or sharded, opened lazily (nothing is read until asked)."""

    def __init__(self, path: str):
        from safetensors import safe_open
        if os.path.isfile(os.path.join(path, INDEX)):
            with open(os.path.join(path, INDEX)) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [WEIGHTS]
        self._handles = {}
        for name in files:
            if not os.path.isfile(os.path.join(path, name)):
                raise LayoutError(f"{INDEX} names {name}, which is not in {path}")
            handle = safe_open(os.path.join(path, name), framework="pt", device="cpu")
            self._handles.update({key: handle for key in handle.keys()})

    def keys(self) -> set[str]:
        return set(self._handles)

    def __contains__(self, key: str) -> bool:
        return key in self._handles

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handles[key].get_slice(key).get_shape())

    def tensor(self, key: str):
        return self._handles[key].get_tensor(key)

    def slice(self, key: str, index: tuple):
        """Only `index` (a tuple of slices) of the tensor is read from disk."""
        return self._handles[key].get_slice(key)[index]
