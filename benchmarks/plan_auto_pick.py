"""parallel=auto on this CPU: does its pick measure fastest among the top three it lists?

    python benchmarks/plan_auto_pick.py [--workers 2 4 8] [--rounds 3] [--steps 12] [--model small]

For each world size: rank the layouts (this CPU measured on the spot), then run the top three as real
jobs, interleaved, `--rounds` times (a slow minute hits all three alike). Prints predicted tokens/s and
the median and spread of measured tokens/s (each run: median of the steps after the first three) side
by side, and where the pick stands: the fastest, or behind the fastest by more or less than the spread
of the runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

from framework.config.paths import CONFIG_DIR  # noqa: E402
from framework.compose.config_store import register_configs  # noqa: E402
from benchmarks.job_metrics import job_metrics  # noqa: E402
from framework.plan.auto import rank_layouts  # noqa: E402
from framework.plan.hardware import measured_cpu  # noqa: E402


def tokens_per_sec(args: list[str], steps: int) -> float:
    return statistics.median(r["tokens_per_sec"] for r in job_metrics(args, steps)[3:])


def verdict(runs: list[list[float]]) -> str:
    medians = [statistics.median(r) for r in runs]
    best = max(range(len(runs)), key=medians.__getitem__)
    if best == 0:
        return f"the pick (#1) is the fastest measured ({medians[0] / max(medians[1:]):.3f}x the next)"
    # the pick is behind: by more than the runs' own scatter, or within it
    behind = 1 - medians[0] / medians[best]
    scatter = max((max(r) - min(r)) / statistics.median(r) for r in (runs[0], runs[best]))
    within = "within" if behind <= scatter else "more than"
    return (f"the pick (#1) is {behind:.1%} behind #{best + 1}, {within} the runs' spread "
            f"({scatter:.1%})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="small")
    opts = ap.parse_args()
    common = [f"model={opts.model}", "data.seq_len=128", "trainer.global_batch_size=32"]
    register_configs()
    for world in opts.workers:
        with initialize_config_dir(str(CONFIG_DIR), version_base=None):
            cfg = compose("config", overrides=[*common, "parallel=auto", f"launcher.nproc_per_node={world}"])
        ranked = rank_layouts(cfg, world, measured_cpu(), world)[:3]
        runs: list[list[float]] = [[] for _ in ranked]
        for _ in range(opts.rounds):
            for i, (cand, _plan) in enumerate(ranked):
                args = [*common, *cand.overrides(), f"launcher.nproc_per_node={world}"]
                runs[i].append(tokens_per_sec(args, opts.steps))
        print(f"\n{world} workers: {'layout':<64}{'predicted tok/s':>16}{'measured tok/s':>16}{'spread':>9}")
        for i, ((cand, plan), got) in enumerate(zip(ranked, runs), 1):
            spread = (max(got) - min(got)) / statistics.median(got)
            print(f"  #{i} {cand.describe():<68}{plan.tokens_per_sec:>16,.0f}{statistics.median(got):>16,.0f}"
                  f"{spread:>9.1%}")
        print(f"  {verdict(runs)}")


if __name__ == "__main__":
    main()
