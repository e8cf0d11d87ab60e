"""The interface every experiment tracker implements (one class per backend, beside this file), and the
values they all log: the flattened resolved config as parameters, each record's numbers, the summary."""
from __future__ import annotations

import json
from abc import ABC, abstractmethod

from omegaconf import OmegaConf

from framework.redact import redacted


class TrackerError(Exception):
    """A tracker that cannot be reached or started: `tracker_name: what went wrong; what would work`."""


class Tracker(ABC):
    name: str = ""
    package: str = ""           #: the client library it needs (the extra `framework[<name>]` installs it)

    @classmethod
    def probe(cls, cfg) -> None:
        """In the launching process, before any work: TrackerError if the tracker cannot be reached."""

    @abstractmethod
    def start(self, cfg, run_dir: str, run_id: str | None) -> str | None:
        """Start a run, or continue the one `run_id` names (the job's earlier attempt); log the parameters.
        Returns the id to keep in the run dir for a resumed attempt (None: nothing to continue)."""

    @abstractmethod
    def log(self, step: int, metrics: dict[str, float], texts: dict[str, str]) -> None:
        """One record: its numbers, and its strings (text samples)."""

    def log_summary(self, summary: dict) -> None:
        """The end of the run: final values, where the checkpoint is and how to export it."""

    @abstractmethod
    def close(self, finished: bool) -> None:
        """`finished`: the run reached its last step (else it was stopped: preempted, or failed)."""


def flat_params(cfg) -> dict[str, str | int | float | bool | None]:
    """The resolved config as dotted keys, credentials redacted; lists as JSON."""
    out = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    walk(redacted(OmegaConf.to_container(cfg, resolve=True)), "")
    return out


def split_record(record: dict) -> tuple[int, dict[str, float], dict[str, str]]:
    """(step, numbers, strings) of a metrics record."""
    numbers = {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
    texts = {k: v for k, v in record.items() if isinstance(v, str)}
    return record["step"], numbers, texts
