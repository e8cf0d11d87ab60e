"""parallel=auto on this CPU: does its pick measure fastest among the top three it lists?

    python benchmarks/plan_auto_pick.py [--workers 2 4 8] [--steps 12] [--model small]

For each world size: rank the layouts (this CPU measured on the spot), run the top three as real jobs,
and print predicted and measured tokens/s side by side (median of the steps after the first three).
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
from framework.config.store import register_configs  # noqa: E402
from benchmarks.job_metrics import job_metrics  # noqa: E402
from framework.plan.auto import rank_layouts  # noqa: E402
from framework.plan.hardware import measured_cpu  # noqa: E402


def tokens_per_sec(args: list[str], steps: int) -> float:
    return statistics.median(r["tokens_per_sec"] for r in job_metrics(args, steps)[3:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="small")
    opts = ap.parse_args()
    common = [f"model={opts.model}", "data.seq_len=128", "trainer.global_batch_size=32"]
    register_configs()
    for world in opts.workers:
        with initialize_config_dir(str(CONFIG_DIR), version_base=None):
            cfg = compose("config", overrides=[*common, "parallel=auto", f"launcher.nproc_per_node={world}"])
        ranked = rank_layouts(cfg, world, measured_cpu(), world)[:3]
        print(f"\n{world} workers: {'layout':<60}{'predicted tok/s':>16}{'measured tok/s':>16}")
        got = []
        for i, (cand, plan) in enumerate(ranked, 1):
            measured = tokens_per_sec([*common, *cand.overrides(), f"launcher.nproc_per_node={world}"], opts.steps)
            got.append(measured)
            print(f"  #{i} {cand.describe():<68}{plan.tokens_per_sec:>16,.0f}{measured:>16,.0f}")
        best = max(range(len(got)), key=got.__getitem__)
        print(f"  the pick (#1) is {'the fastest measured' if best == 0 else f'slower than #{best + 1}'}"
              f" ({got[0] / max(got):.0%} of the best)")


if __name__ == "__main__":
    main()
