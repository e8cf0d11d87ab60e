"""What trainer.profile costs: the same run without profiling and with steps 2..3 profiled.

    python benchmarks/profile_overhead.py [--rounds 3] [--steps 24] [--after 6] [--model small]

The profiler (framework/metrics/profile.py) records only the steps named in trainer.profile.steps; every
other step runs the same code path as a run without it (a no-op check before and after the step, a null
context). Both runs are compared over the steps after --after (well past the profiled window and its
trace export), interleaved round by round (who goes first alternates). Prints median tokens/s of each,
the ratio profiled / off (1.0 = free) with its spread (min-max over rounds), and the profiled steps' own
tokens/s (what profiling costs while it records).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.job_metrics import job_metrics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--after", type=int, default=6, help="compare steps after this one")
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    opts = ap.parse_args()
    common = [f"model={opts.model}", f"data.seq_len={opts.seq_len}", f"trainer.global_batch_size={opts.batch}",
              f"trainer.micro_batch_size={opts.batch}"]
    variants = {"off": [], "steps=[2,3]": ["trainer.profile.steps=[2,3]"]}
    later: dict[str, list[float]] = {}
    window: list[float] = []
    for r in range(opts.rounds):
        for name in (variants if r % 2 == 0 else reversed(variants)):
            records = job_metrics([*common, *variants[name]], opts.steps)
            later.setdefault(name, []).append(statistics.median(rec["tokens_per_sec"] for rec in records[opts.after:]))
            if name != "off":
                window += [rec["tokens_per_sec"] for rec in records[1:3]]
            print(f"round {r + 1} {name:<12} {later[name][-1]:9.0f} tokens/s", file=sys.stderr, flush=True)
    ratios = [p / o for p, o in zip(later["steps=[2,3]"], later["off"])]
    print(f"model={opts.model} seq_len={opts.seq_len} global_batch={opts.batch} steps={opts.steps} "
          f"(median of steps {opts.after + 1}..{opts.steps}) rounds={opts.rounds}")
    print(f"{'trainer.profile':<18}{'tokens/s':>10}{'ratio':>8}{'spread':>14}")
    print(f"{'off':<18}{statistics.median(later['off']):>10,.0f}")
    print(f"{'steps=[2,3]':<18}{statistics.median(later['steps=[2,3]']):>10,.0f}{statistics.median(ratios):>8.3f}"
          f"{f'{min(ratios):.3f}-{max(ratios):.3f}':>14}")
    print(f"{'  (steps 2-3 while recording)':<18}{statistics.median(window):>10,.0f}")


if __name__ == "__main__":
    main()
