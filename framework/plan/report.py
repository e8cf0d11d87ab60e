"""The plan as a table for people."""
from __future__ import annotations

from framework.plan.planner import Plan

GIB = 1024 ** 3


def _size(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def table(plan: Plan) -> str:
    m = plan.per_rank_bytes
    lines = [f"layout: {plan.layout.describe()} on {plan.layout.world} x {plan.device}"]
    if plan.experts:
        e = plan.experts
        lines += ["", f"parameters       {e['params'] / 1e9:.2f} B, {e['active_params'] / 1e9:.2f} B active per token "
                      f"(FLOPs and MFU count active)",
                  f"expert weights   {e['expert_params_per_rank'] / 1e9:.2f} B parameters on this rank"]
    lines += ["", "per-rank memory (most loaded rank)"]
    for key in ("params", "grads", "optimizer", "master", "activations", "buffers"):
        lines.append(f"  {key:<12} {_size(m[key]):>12}")
    if m.get("reference"):
        lines.append(f"  {'reference':<12} {_size(m['reference']):>12}  the objective's frozen reference model")
    if m.get("offloaded"):
        lines.append(f"  {'(host)':<12} {_size(m['offloaded']):>12}  offloaded, not counted below")
    if m.get("step_scratch"):
        lines.append(f"  {'step scratch':<12} {_size(m['step_scratch']):>12}  the optimizer step's temporaries")
    verdict = ("fits" if plan.fits else f"DOES NOT FIT (over by {plan.over_by:.0%})" if plan.refused
               else f"over by {plan.over_by:.0%}, within what the planner over-estimates: may run")
    lines.append(f"  {'peak':<12} {_size(m['total']):>12}  ({m.get('peak_at', 'backward')}) of "
                 f"{_size(plan.capacity_bytes)}: {verdict}")
    lines += ["", "communication per step (per rank, payload)"]
    for key, value in plan.comm_bytes_per_step.items():
        lines.append(f"  {key:<30} {_size(value):>12}")
    if not plan.comm_bytes_per_step:
        lines.append("  none")
    lines += ["", f"pipeline bubble  {plan.bubble:.1%}",
              f"step time        {plan.step_time_s:.3g} s  (compute {plan.step_time_from})",
              f"tokens/s         {plan.tokens_per_sec:,.0f}",
              f"MFU              {plan.mfu:.1%}"]
    return "\n".join(lines)
