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


def oracle_for(scratch: str | None = None) -> Oracle:
    scratch = scratch or tempfile.mkdtemp(prefix="matrix")
    return Oracle(discover(scratch), scratch)


def stored_plan(oracle: Oracle) -> Plan | None:
    """The plan as last stored, unchecked."""
    return Plan.from_json(oracle.axes, json.loads(STORED.read_text())) if STORED.exists() else None


def checked_plan(oracle: Oracle) -> tuple[Plan, float]:
    """The stored plan, checked against the framework and completed; the seconds that took."""
    started = time.perf_counter()
    plan = Cover(oracle).plan(stored_plan(oracle))
    return plan, time.perf_counter() - started


def current_plan(scratch: str | None = None) -> tuple[Plan, Oracle, float]:
    oracle = oracle_for(scratch)
    plan, seconds = checked_plan(oracle)
    return plan, oracle, seconds


def store(plan: Plan) -> None:
    STORED.write_text(json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n")
