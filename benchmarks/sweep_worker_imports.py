"""What the workers' imports cost a CPU sweep: the fork server preloading what the job's model, float8 and
compile import (as `python -m framework` does) against each worker importing them after the fork.

    python benchmarks/sweep_worker_imports.py [--rounds 3] [--points 3]

One sweep of `--points` points (fsdp zero=stage3 on 2 workers, a tiny transformers Llama, emulated float8, compiled with
aot_eager, 2 steps, one learning rate a point), run both ways in interleaved rounds. Prints the machine's busy
CPU seconds (/proc/stat, every process) and the wall seconds of each sweep, their medians and spread, and the
ratios; and the loss of the last step of every point, the same both ways.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: the launcher as `python -m framework`, with the fork server preloading only the strategy's modules
WORKERS_IMPORT = ("from framework.launch import torch as engine; "
                  "engine.fork_server_preload = lambda cls, cfg: cls.worker_preload(cfg); "
                  "import runpy; runpy.run_module('framework', run_name='__main__')")
WAYS = {"fork server preloads": ["-m", "framework"], "each worker imports": ["-c", WORKERS_IMPORT]}


def _busy_cpu_seconds() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / 100


def sweep(way: list[str], overrides: list[str], root: str) -> tuple[float, float, list[float]]:
    cpu, wall = _busy_cpu_seconds(), time.perf_counter()
    subprocess.run([sys.executable, *way, "-m", *overrides, f"hydra.sweep.dir={root}"], cwd=REPO, check=True,
                   capture_output=True)
    cpu, wall = _busy_cpu_seconds() - cpu, time.perf_counter() - wall
    losses = [json.loads(p.read_text().splitlines()[-1])["loss"] for p in sorted(Path(root).glob("*/metrics.jsonl"))]
    return cpu, wall, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=3)
    args = parser.parse_args()
    from framework.models.spec import spec_named
    scratch = tempfile.mkdtemp()
    lrs = ",".join(f"{1e-3 * (i + 1):g}" for i in range(args.points))
    overrides = ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2", *spec_named("hf").smallest_overrides(scratch),
                 "precision=float8", "precision.float8_emulate=true", "trainer.compile=true",
                 "trainer.compile_backend=aot_eager", "data.seq_len=32", "trainer.global_batch_size=4",
                 "trainer.micro_batch_size=2", "trainer.max_steps=2", "trainer.log_every=1", "trainer.eval_every=0",
                 "trainer.progress_bar=false", "logging.trackers=[]", "checkpoint.enabled=false", f"optimizer.lr={lrs}"]
    seen: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    losses: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for way, argv in (WAYS.items() if r % 2 == 0 else reversed(WAYS.items())):
            cpu, wall, losses[way] = sweep(argv, overrides, tempfile.mkdtemp(dir=scratch))
            seen[way].append((cpu, wall))
            print(f"round {r + 1}  {way:22s} cpu {cpu:6.1f} s  wall {wall:6.1f} s", flush=True)
    print(f"\n{args.points} points x 2 workers, {args.rounds} interleaved rounds (median, min-max):")
    for way, rows in seen.items():
        cpus, walls = [c for c, _ in rows], [w for _, w in rows]
        print(f"  {way:22s} cpu {statistics.median(cpus):6.1f} s ({min(cpus):.1f}-{max(cpus):.1f})  "
              f"wall {statistics.median(walls):6.1f} s ({min(walls):.1f}-{max(walls):.1f})  last losses {losses[way]}")
    (pre, each) = ([statistics.median([row[i] for row in seen[way]]) for i in (0, 1)] for way in WAYS)
    print(f"  preloading / each worker importing: cpu {pre[0] / each[0]:.2f}, wall {pre[1] / each[1]:.2f}")


if __name__ == "__main__":
    main()
