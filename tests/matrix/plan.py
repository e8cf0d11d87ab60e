"""The plan the matrix runs: stored in tests/matrix/plan.json (so CI searches only what a new option adds),
checked and completed against the framework as it is now."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from tests.matrix.axes import discover
from tests.matrix.cover import Cover, Plan
from tests.matrix.oracle import Oracle

STORED = Path(__file__).with_name("plan.json")


def current_plan(scratch: str | None = None) -> tuple[Plan, Oracle, float]:
    scratch = scratch or tempfile.mkdtemp(prefix="matrix")
    axes = discover(scratch)
    oracle = Oracle(axes, scratch)
    stored = Plan.from_json(axes, json.loads(STORED.read_text())) if STORED.exists() else None
    started = time.perf_counter()
    plan = Cover(oracle).plan(stored)
    return plan, oracle, time.perf_counter() - started


def store(plan: Plan) -> None:
    STORED.write_text(json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n")
