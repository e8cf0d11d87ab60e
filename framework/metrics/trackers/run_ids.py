"""The tracker runs of a job, kept in its run dir (`trackers.json`: tracker name -> run id), so that a
resumed or requeued attempt continues the same run: a preempted job leaves one run, not two."""
from __future__ import annotations

import json
import os

FILE = "trackers.json"


def recorded(run_dir: str) -> dict[str, str]:
    try:
        with open(os.path.join(run_dir, FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {}


def record(run_dir: str, ids: dict[str, str]) -> None:
    path = os.path.join(run_dir, FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(ids, f, indent=1)
    os.replace(path + ".tmp", path)
