"""Metric name -> "module:function". Adding a metric: one module with a function of the run's strategy (its
`model`, `device`, ranks) returning a number, and one line here (or `register` at runtime). It is read on the
steps that write a metrics record, never on the others (so it may wait for the device), and its value is in
every record under its name: metrics.jsonl, the trackers and the progress bar. The numbers a model's spec or a
strategy report of themselves come from their `step_metrics`; the loop's timing and memory from what measures
them (framework/metrics/step_records.py gathers them all)."""
from __future__ import annotations

import importlib

#: none by default: every metric a record holds today comes with what measures it
METRICS: dict[str, str] = {}


def register(name: str, path: str) -> None:
    """Another metric under `name` (a plugin or a test): `path` is "module:function"."""
    METRICS[name] = path


def registered_metrics(strategy) -> dict[str, float]:
    values = {}
    for name, path in METRICS.items():
        module, function = path.split(":")
        values[name] = float(getattr(importlib.import_module(module), function)(strategy))
    return values
