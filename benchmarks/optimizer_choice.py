"""What the optimizer choice does to the default job: its loss after N steps with optimizer=adamw and with
optimizer=muon (each at its group's defaults), on the same tokens (same seed, data and batches).

    python benchmarks/optimizer_choice.py [--steps 200] [--last 20] [--extra scheduler=wsd ...]

Prints, per optimizer, the mean training loss over the last --last steps and at the last step, and the median
tokens/s (Muon's Newton-Schulz runs in bf16, which a CPU computes slowly; on a GPU it is a small part of a step).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.job_metrics import job_metrics  # noqa: E402

OPTIMIZERS = ("adamw", "muon")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--last", type=int, default=20, help="average the loss over these last steps")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides given to both jobs")
    opts = ap.parse_args()
    rows = []
    for name in OPTIMIZERS:
        records = job_metrics([f"optimizer={name}", *opts.extra], opts.steps)
        losses = [r["loss"] for r in records]
        rows.append((name, statistics.fmean(losses[-opts.last:]), losses[-1],
                     statistics.median(r["tokens_per_sec"] for r in records[1:])))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"the default job, {opts.steps} steps {' '.join(opts.extra)}".rstrip())
    print(f"{'optimizer':<12}{f'loss (mean of last {opts.last})':>26}{'loss (last)':>14}{'tokens/s':>10}")
    for name, mean, last, speed in rows:
        print(f"{name:<12}{mean:>26.4f}{last:>14.4f}{speed:>10,.0f}")


if __name__ == "__main__":
    main()
