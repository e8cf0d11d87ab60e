"""One evaluation through lm-eval's `simple_evaluate`, and its scores as a metrics record and a table."""
from __future__ import annotations

import random

import numpy as np
import torch

PREFIX = "eval"


def record_key(task: str, metric: str) -> str:
    """The name a score has in a step's metrics record (and in checkpoint.score)."""
    return f"{PREFIX}/{task}/{metric}"


def evaluate(lm, tasks: list, manager, limit: int | None, apply_chat_template: bool = False,
             bootstrap_iters: int = 100000) -> dict | None:
    """lm-eval's results dict ({task: {"metric,filter": value, "metric_stderr,filter": ...}}), or None where
    lm-eval keeps them from this process (LOCAL_RANK != 0). No global random state moves: lm-eval's reseeding
    is off (its few-shot sampler seeds itself) and Python's, NumPy's and torch's states are put back."""
    from lm_eval import simple_evaluate
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=False,
                              bootstrap_iters=bootstrap_iters, apply_chat_template=apply_chat_template,
                              random_seed=None, numpy_random_seed=None, torch_random_seed=None)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    return None if out is None else out["results"]


def _rows(results: dict):
    """(task, metric, value, stderr or None) for each score, in the order lm-eval reports them."""
    for task, scores in results.items():
        for key, value in scores.items():
            metric, _, _ = key.partition(",")
            if "," not in key or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = scores.get(key.replace(metric, f"{metric}_stderr", 1))
            yield task, metric, float(value), stderr if isinstance(stderr, (int, float)) else None


def record(results: dict) -> dict[str, float]:
    """{eval/<task>/<metric>: value}: what a step's metrics record (and so every tracker) gets."""
    return {record_key(task, metric): value for task, metric, value, _ in _rows(results)}


def table(results: dict) -> list[dict]:
    return [{"task": task, "metric": metric, "value": value, "stderr": stderr}
            for task, metric, value, stderr in _rows(results)]


def printed(rows: list[dict]) -> str:
    widths = [max(len("task"), *(len(r["task"]) for r in rows)), max(len("metric"), *(len(r["metric"]) for r in rows))]
    lines = [f"{'task':<{widths[0]}}  {'metric':<{widths[1]}}  {'value':>12}  {'stderr':>10}"]
    for r in rows:
        stderr = "" if r["stderr"] is None else f"{r['stderr']:.4f}"
        lines.append(f"{r['task']:<{widths[0]}}  {r['metric']:<{widths[1]}}  {r['value']:>12.6g}  {stderr:>10}")
    return "\n".join(lines)
