"""Cache keys for the planner's traces: a config subtree's resolved values as sorted JSON, several times
cheaper to make than its YAML (parallel=auto asks for thousands while it ranks its layouts)."""
from __future__ import annotations

import json

from omegaconf import OmegaConf


def config_key(node) -> str:
    return json.dumps(OmegaConf.to_container(node, resolve=True), sort_keys=True, default=str)
