"""On a real GPU: NVML's readings reach the records, and trainer.on_oom=retry recovers from a real CUDA
out-of-memory error (CPU tests inject it and stub NVML; this is what they cannot show).

    python benchmarks/gpu_health_oom_check.py [--micro 256] [--steps 6] [-- overrides ...]

Job 1 starts at a micro-batch of --micro sequences of 2048 tokens (the llama_125m recipe's model in bf16, far
more than one GPU holds), with trainer.on_oom=retry: it must halve until a step fits and go on. Job 2 starts
at the micro-batch job 1 settled on (in its first step). It prints the micro-batch of each step, job 1's
warnings, both loss curves and their largest relative difference (trainer.deterministic=true and the same
micro-batches in every step: expect 0; what a failed attempt left behind would show), and rank 0's GPU
readings from the last record (temperature, power, SM clock, throttle reasons, ECC counts). planner.check is
off: the planner would refuse job 1's micro-batch before it starts.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = ["model=llama_125m", "data=synthetic", "data.vocab_size=32000", "model.vocab_size=32000",
         "data.seq_len=2048", "precision=bf16", "trainer.deterministic=true", "trainer.log_every=1",
         "trainer.eval_every=0", "trainer.progress_bar=false", "checkpoint.enabled=false", "planner.check=false"]


def job(args: list[str]) -> tuple[list[dict], str]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        proc = subprocess.run([sys.executable, "-m", "framework", *args, f"hydra.run.dir={run_dir}"], cwd=REPO,
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"exit {proc.returncode}:\n{proc.stderr[-3000:]}")
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("overrides", nargs="*")
    opts = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("no GPU here: nothing to check")
    base = [*MODEL, f"trainer.max_steps={opts.steps}", f"trainer.global_batch_size={opts.micro}", *opts.overrides]
    retried, stderr = job([*base, f"trainer.micro_batch_size={opts.micro}", "trainer.on_oom=retry"])
    settled = retried[-1]["micro_batch_size"]
    plain, _ = job([*base, f"trainer.micro_batch_size={settled}"])
    print("micro-batch per step:", [r["micro_batch_size"] for r in retried])
    print("\n".join(line for line in stderr.splitlines() if line.startswith("warning: trainer.on_oom")))
    for name, records in (("retried", retried), (f"at {settled}", plain)):
        print(f"{name:>10}: " + " ".join(f"{r['loss']:.5f}" for r in records))
    print("max relative loss difference:",
          max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(retried, plain)))
    print("GPU readings of rank 0:", {k: v for k, v in retried[-1].items() if k.startswith("gpu/")} or "none (no NVML?)")


if __name__ == "__main__":
    main()
