"""Keys that are gone, refused on the command line with one line saying what replaced them (Hydra's own
error for a key no schema has takes several lines and says nothing of the replacement)."""
from __future__ import annotations

from framework.errors import ConfigError

REMOVED = {
    "logging.tensorboard": "replaced by logging.trackers: logging.trackers=[] writes no TensorBoard events, "
                           "'logging.trackers=[tensorboard,mlflow]' adds MLflow",
}


def refuse_removed_keys(overrides: list[str]) -> None:
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in REMOVED:
            raise ConfigError(key, REMOVED[key])
