"""Soak test of elastic restarts: N jobs in a row, each SIGKILLed somewhere, each must come back.

    python benchmarks/restart_soak.py --iterations 20

Every iteration is a real 2-worker DDP job (tiny model, checkpoints every 4 of 8 steps) with one or two
SIGKILLs injected through FRAMEWORK_FAULT, rotating over rank 0 / rank 1, mid-step at different steps,
mid-save, mid-eval and start-up. An iteration passes when the job exits 0 within --timeout and its
losses equal a clean run's (<= 1e-6). Prints one line per iteration and a summary; exit 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ["model=tiny", "data.seq_len=32", "trainer.max_steps=8", "trainer.global_batch_size=8",
        "trainer.micro_batch_size=2", "trainer.log_every=1", "trainer.eval_every=6", "trainer.eval_batches=1",
        "trainer.progress_bar=false", "logging.trackers=[]", "optimizer.lr=3e-3", "scheduler.warmup_steps=2",
        "parallel=ddp", "launcher.nproc_per_node=2", "checkpoint.enabled=true", "checkpoint.interval=4",
        "launcher.max_restarts=3"]

SCENARIOS = [
    "step:7:rank=1:attempt=0",
    "step:6:rank=0:attempt=0",
    "save:4:rank=0:attempt=0",
    "step:2:rank=1:attempt=0",
    "eval:6:rank=1:attempt=0",
    "startup:0:rank=0:attempt=0,step:5:rank=1:attempt=1",
    "step:5:rank=0:attempt=0",
    "save:8:rank=1:attempt=0",
    "step:3:rank=0:attempt=0,startup:0:rank=1:attempt=1",
    "eval:6:rank=0:attempt=0",
]


def run(run_dir: Path, fault: str, timeout: float) -> tuple[int | None, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FRAMEWORK_FAULT": fault}
    start = time.monotonic()
    with subprocess.Popen([sys.executable, "-m", "framework", *ARGS, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, time.monotonic() - start
    return proc.returncode, time.monotonic() - start


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        code, _ = run(Path(tmp) / "clean", "", opts.timeout)
        assert code == 0, "the clean reference run failed"
        reference = losses(Path(tmp) / "clean")
        times, failures = [], 0
        for i in range(opts.iterations):
            fault = SCENARIOS[i % len(SCENARIOS)]
            run_dir = Path(tmp) / f"run{i}"
            code, seconds = run(run_dir, fault, opts.timeout)
            ok = code == 0 and max(abs(a - b) / abs(a) for a, b in zip(reference, losses(run_dir))) <= 1e-6 \
                and len(losses(run_dir)) == len(reference)
            failures += not ok
            times.append(seconds)
            outcome = "ok" if ok else ("HUNG (killed at timeout)" if code is None else f"FAILED exit {code}")
            print(f"{i + 1:3d}  {fault:55s} {seconds:6.1f} s  {outcome}", flush=True)
    print(f"{opts.iterations - failures}/{opts.iterations} passed; per job median {statistics.median(times):.1f} s, "
          f"min {min(times):.1f} s, max {max(times):.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
