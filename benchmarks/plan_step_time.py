"""The planner's step time next to the measured one on this CPU (gloo), layout by layout.

    python benchmarks/plan_step_time.py [--rounds 2] [--steps 12] [--model small] [--only ddp,3d_tp2]

Each round plans and runs every layout once (rounds interleave, so a slow minute hits all layouts
alike); the measured step time is the median `step_time` of the steps after the first three. The plan
uses this CPU measured on the spot (matmul FLOP/s, copy bandwidth, gloo latency) and the model timed on
it (framework/plan/cpu_calibration.py), in a fresh `python -m framework.plan --json` each round: a
calibration is a few seconds of this noisy machine, as a measurement is, so each round's prediction is
held to that round's measurement. Prints the median predicted and measured seconds, and the median and
spread of the per-round ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.job_metrics import job_metrics  # noqa: E402

LAYOUTS = {
    "single": ["parallel=single"],
    "ddp": ["parallel=ddp"],
    "ddp_zero1": ["parallel=ddp", "zero=stage1"],
    "fsdp_zero2": ["parallel=fsdp", "zero=stage2"],
    "fsdp_zero3": ["parallel=fsdp", "zero=stage3"],
    "deepspeed_zero2": ["parallel=deepspeed", "zero=stage2"],
    "3d_tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"],
    "3d_tp2_sp": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1",
                  "parallel.sequence_parallel=true"],
    "3d_pp2": ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=1"],
    "hsdp_2x2": ["parallel=fsdp", "zero=stage3", "parallel.dp_replicate=2", "parallel.dp_shard=2",
                 "launcher.nproc_per_node=4"],
}


def predicted(args: list[str]) -> float:
    out = subprocess.run([sys.executable, "-m", "framework.plan", *args, "--json"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["step_time_s"]


def measured(args: list[str], steps: int) -> float:
    return statistics.median(r["step_time"] for r in job_metrics(args, steps)[3:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="small")
    ap.add_argument("--only", help=f"comma-separated layouts, of {', '.join(LAYOUTS)}")
    opts = ap.parse_args()
    layouts = {k: v for k, v in LAYOUTS.items() if not opts.only or k in opts.only.split(",")}
    common = [f"model={opts.model}", "data.seq_len=128", "trainer.global_batch_size=16", "trainer.micro_batch_size=4"]
    ratios: dict[str, list[float]] = {name: [] for name in layouts}
    got: dict[str, list[float]] = {name: [] for name in layouts}
    plans: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(opts.rounds):
        for name, args in layouts.items():
            p = predicted([*common, *args])
            t = measured([*common, *args], opts.steps)
            plans[name].append(p)
            got[name].append(t)
            ratios[name].append(p / t)
    print(f"{'layout':<18}{'predicted s':>12}{'measured s':>12}{'ratio':>8}{'spread':>8}")
    for name in layouts:
        r = ratios[name]
        print(f"{name:<18}{statistics.median(plans[name]):>12.4f}{statistics.median(got[name]):>12.4f}{statistics.median(r):>8.2f}"
              f"{max(r) - min(r):>8.2f}")
    all_r = [statistics.median(r) for r in ratios.values()]
    print(f"median ratio {statistics.median(all_r):.2f}; within 25%: "
          f"{sum(0.75 <= x <= 1.25 for x in all_r)}/{len(all_r)} layouts")


if __name__ == "__main__":
    main()
