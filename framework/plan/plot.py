"""The plan as a picture (`python -m framework.plan ... --plot FILE.png`): what the most loaded rank holds,
part by part, against the planned peak and the device's memory; and where the step's time goes."""
from __future__ import annotations

from pathlib import Path

from framework.errors import ConfigError
from framework.plan.planner import Plan
from framework.plan.report import GIB

MEMORY_PARTS = ("params", "grads", "optimizer", "master", "reference", "activations", "buffers", "step_scratch")


def plot(plan: Plan, out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot", "plotting needs matplotlib: pip install 'framework[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (mem_ax, time_ax) = plt.subplots(2, 1, figsize=(10, 6))
    m = plan.per_rank_bytes
    left = 0.0
    for part in MEMORY_PARTS:
        size = m.get(part, 0) / GIB
        if size > 0:
            mem_ax.barh(0, size, left=left, label=f"{part} {size:.2f}")
            left += size
    peak, capacity = m["total"] / GIB, plan.capacity_bytes / GIB
    mem_ax.axvline(peak, color="black", linestyle="--", label=f"planned peak {peak:.2f} ({m.get('peak_at', '')})")
    mem_ax.axvline(capacity, color="red", label=f"{plan.device} holds {capacity:.1f}")
    mem_ax.set(title=f"{plan.layout.describe()} on {plan.layout.world} x {plan.device}\n"
                     f"memory of the most loaded rank (its parts are not all held at once)", yticks=[], xlabel="GiB")
    mem_ax.set_xlim(0, max(left, peak, capacity) * 1.05)
    mem_ax.legend(fontsize="small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    left = 0.0
    for part, seconds in plan.time_s.items():
        if seconds > 0:
            time_ax.barh(0, seconds, left=left, label=f"{part} {seconds:.3g} s")
            left += seconds
    time_ax.set(title=f"step time {plan.step_time_s:.3g} s (compute {plan.step_time_from}), "
                      f"{plan.tokens_per_sec:,.0f} tokens/s, MFU {plan.mfu:.1%}", yticks=[], xlabel="seconds")
    time_ax.legend(fontsize="small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
