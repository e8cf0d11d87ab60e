"""What model.loss_chunk_tokens saves and costs, for Llama and its MoE variant alike: peak memory (memory_gb:
the process's peak resident set on CPU, peak allocated on CUDA) and step time of a real job, whole logits
against chunks, on the issue's shapes (32k vocabulary, sequence 512, micro-batch 8, fp32).
    python benchmarks/moe_loss_chunks.py                    # chunks of 64 tokens
    python benchmarks/moe_loss_chunks.py --chunk 512 --steps 6
Each figure is the median over the steps after the first (the first also builds and warms up).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.job_metrics import job_metrics  # noqa: E402

SHAPES = ["data=synthetic", "data.vocab_size=32000", "model.vocab_size=32000", "data.seq_len=512",
          "model.max_seq_len=512", "trainer.global_batch_size=8", "trainer.micro_batch_size=8", "precision=fp32",
          "parallel=single"]
MODELS = {"llama": ["model=tiny"], "moe": ["model=moe_tiny"]}


def measure(model: str, chunk: int, steps: int) -> tuple[float, float]:
    records = job_metrics([*MODELS[model], *SHAPES, f"model.loss_chunk_tokens={chunk}"], steps)[1:]
    return (statistics.median(r["memory_gb"] for r in records), statistics.median(r["step_time"] for r in records))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    print(f"vocab 32000, seq 512, micro-batch 8, fp32, one process; chunk {args.chunk} tokens")
    print(f"{'model':6} {'memory_gb whole':>16} {'chunked':>8} {'step_s whole':>13} {'chunked':>8} {'slower':>7}")
    for model in MODELS:
        (mem0, t0), (mem1, t1) = measure(model, 0, args.steps), measure(model, args.chunk, args.steps)
        print(f"{model:6} {mem0:16.2f} {mem1:8.2f} {t0:13.3f} {t1:8.3f} {t1 / t0:6.2f}x")


if __name__ == "__main__":
    main()
