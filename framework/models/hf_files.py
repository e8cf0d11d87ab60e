"""The files of a Hugging Face model directory, as every model family's adapter reads and writes them."""
from __future__ import annotations

import json
import os

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def read_config(path: str) -> dict:
    with open(os.path.join(path, CONFIG)) as f:
        return json.load(f)


class LayoutError(ValueError):
    """Weights that do not fit the model (an unknown name or a wrong shape)."""
