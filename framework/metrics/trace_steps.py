"""The time per step that a profiler trace (StepProfiler's `rank_<r>.pt.trace.json`) shows, to hold the
reported step_time against.

host: the mean span of the `ProfilerStep#<k>` events, each from the start of step k to the start of the
next (so the host's waits between steps are in it). device (traces with GPU activity only): the period
of the device's work, from the first kernel or copy launched in the first profiled step to the first one
launched in the last, divided by the steps in between. A host that runs ahead of the device would make
its own spans short; the device's period is what a step really takes there.
"""
from __future__ import annotations

import json

STEP_PREFIX = "ProfilerStep#"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def trace_step_times(path: str) -> dict:
    """{"steps": [k, ...], "host": seconds per step, "device": seconds per step or None}."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((int(e["name"][len(STEP_PREFIX):]), e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_PREFIX))
    if not steps:
        raise ValueError(f"{path}: no {STEP_PREFIX}<k> spans (a trace written by trainer.profile.steps?)")
    host = sum(end - start for _, start, end in steps) / len(steps) / 1e6
    return {"steps": [k for k, _, _ in steps], "host": host, "device": _device_period(events, steps)}


def _device_period(events: list[dict], steps: list[tuple]) -> float | None:
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES and e.get("ph") == "X"]
    if len(steps) < 2 or not device:
        return None
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    first_in_step: dict[int, float] = {}
    for e in device:
        at = launched.get(e.get("args", {}).get("correlation"))
        step = next((k for k, start, end in steps if at is not None and start <= at < end), None)
        if step is not None:
            first_in_step[step] = min(first_in_step.get(step, e["ts"]), e["ts"])
    first, last = steps[0][0], steps[-1][0]
    if first not in first_in_step or last not in first_in_step:
        return None
    return (first_in_step[last] - first_in_step[first]) / (last - first) / 1e6
