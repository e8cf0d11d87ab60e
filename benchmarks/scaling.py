"""How step time grows with model size and with the number of data-parallel workers, on this machine.

    python benchmarks/scaling.py [--rounds 3] [--steps 8] [--warmup 3] [--seq-len 64] [--batch 8]
        [--models tiny,small,llama_125m] [--workers 1,2,4] [--workers-model small]

Model size: parallel=single with model=tiny -> small -> llama_125m at a fixed seq_len and global batch.
Workers: parallel=ddp with launcher.nproc_per_node=1, 2, 4 (--workers-model, same global batch, so each
worker's share shrinks: strong scaling; the framework gives each worker cores // workers threads).
Rounds interleave every configuration; a run's step time is the median over the steps after --warmup.
Prints per configuration the median over rounds and its spread (min-max), tokens/s, and the step time
relative to the first row of its table.
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
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--models", default="tiny,small,llama_125m")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--workers-model", default="small")
    opts = ap.parse_args()
    common = [f"data.seq_len={opts.seq_len}", f"trainer.global_batch_size={opts.batch}"]
    configs: dict[tuple[str, str], list[str]] = {}
    for model in opts.models.split(","):
        configs[("model", model)] = [*common, "parallel=single", f"model={model}",
                                     f"trainer.micro_batch_size={opts.batch}"]
    for n in map(int, opts.workers.split(",")):
        configs[("workers", f"ddp x{n}")] = [*common, "parallel=ddp", f"model={opts.workers_model}",
                                              f"launcher.nproc_per_node={n}", f"trainer.micro_batch_size={opts.batch // n}"]
    times: dict[tuple[str, str], list[float]] = {}
    params: dict[tuple[str, str], float] = {}
    for r in range(opts.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for key in order:
            records = job_metrics(configs[key], opts.steps)
            times.setdefault(key, []).append(statistics.median(rec["step_time"] for rec in records[opts.warmup:]))
            params[key] = records[-1]["param_bytes"] / 4 * records[-1]["world_size"] if key[0] == "model" else 0
            print(f"round {r + 1} {key[1]:<12} {times[key][-1]:.3f} s/step", file=sys.stderr, flush=True)
    tokens = opts.batch * opts.seq_len
    print(f"seq_len={opts.seq_len} global_batch={opts.batch} steps={opts.steps} (median of steps "
          f"{opts.warmup + 1}..{opts.steps}) rounds={opts.rounds}")
    for table, title in (("model", "parallel=single, model size"),
                         ("workers", f"parallel=ddp, model={opts.workers_model}, workers")):
        keys = [k for k in configs if k[0] == table]
        base = statistics.median(times[keys[0]])
        print(f"\n{title}")
        print(f"{'':<14}{'params':>10}{'step s':>9}{'spread s':>16}{'tokens/s':>10}{'x first':>9}")
        for key in keys:
            med = statistics.median(times[key])
            spread = f"{min(times[key]):.3f}-{max(times[key]):.3f}"
            shown = f"{params[key] / 1e6:.2f}M" if params[key] else "-"
            print(f"{key[1]:<14}{shown:>10}{med:>9.3f}{spread:>16}{tokens / med:>10,.0f}{med / base:>9.2f}")


if __name__ == "__main__":
    main()
