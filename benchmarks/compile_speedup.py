"""trainer.compile=true vs eager, per strategy, on this machine.

    python benchmarks/compile_speedup.py [--rounds 2] [--steps 16] [--model small]

Rounds interleave eager and compiled runs of every layout; each run's tokens/s is the median of the steps
after the first four (compilation is logged apart, as compile_time). Prints both, the ratio
(compiled / eager; > 1 = faster) per round's median, and the spread of the ratio between rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.job_metrics import job_metrics  # noqa: E402

LAYOUTS = {
    "single": ["parallel=single"],
    "ddp x2": ["parallel=ddp"],
    "fsdp x2": ["parallel=fsdp", "zero=stage3"],
    "3d pp2": ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=1"],
    "3d tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--model", default="small")
    opts = ap.parse_args()
    common = [f"model={opts.model}", "data.seq_len=128", "trainer.global_batch_size=16"]
    runs: dict[tuple[str, bool], list[float]] = {}
    for _ in range(opts.rounds):
        for name, args in LAYOUTS.items():
            for compiled in (False, True):
                records = job_metrics([*common, *args, f"trainer.compile={str(compiled).lower()}"], opts.steps)
                runs.setdefault((name, compiled), []).append(statistics.median(r["tokens_per_sec"] for r in records[4:]))
    print(f"{'layout':<10}{'eager tok/s':>14}{'compiled tok/s':>16}{'ratio':>8}{'spread':>8}")
    for name in LAYOUTS:
        eager, comp = runs[(name, False)], runs[(name, True)]
        ratios = [c / e for c, e in zip(comp, eager)]
        print(f"{name:<10}{statistics.median(eager):>14,.0f}{statistics.median(comp):>16,.0f}"
              f"{statistics.median(ratios):>8.2f}{max(ratios) - min(ratios):>8.2f}")


if __name__ == "__main__":
    main()
