"""What model.loss_chunk_tokens saves and costs, for Llama and its MoE variant alike, on the issue's shapes
(32k vocabulary, sequence 512, micro-batch 8 = 4,096 tokens, fp32, one process):
  - memory and wall time: a real job's memory_gb (the process's peak resident set on CPU, peak allocated
    on CUDA) and step_time (torch's default threads), medians over the steps after the first;
  - CPU time: one training step (forward, loss, backward, optimizer step) of the same model in this
    process on one thread, the median of --steps steps after a warm-up one. On a shared machine the wall
    clock measures the neighbours as much as the step; CPU time less so.
    python benchmarks/moe_loss_chunks.py                    # chunks of 64 and 512 tokens
    python benchmarks/moe_loss_chunks.py --chunks 1024 --steps 6
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.job_metrics import job_metrics  # noqa: E402
from framework.config.paths import CONFIG_DIR  # noqa: E402
from framework.compose.config_store import register_configs  # noqa: E402
from framework.models.factory import ModelFactory  # noqa: E402
from framework.models.loss import cross_entropy  # noqa: E402

SHAPES = ["data=synthetic", "data.vocab_size=32000", "model.vocab_size=32000", "data.seq_len=512",
          "model.max_seq_len=512", "trainer.global_batch_size=8", "trainer.micro_batch_size=8", "precision=fp32",
          "parallel=single"]
MODELS = {"llama": ["model=tiny"], "moe": ["model=moe_tiny"]}


def job_memory_and_step(model: str, chunk: int, steps: int) -> tuple[float, float]:
    records = job_metrics([*MODELS[model], *SHAPES, f"model.loss_chunk_tokens={chunk}"], steps + 1)[1:]
    return statistics.median(r["memory_gb"] for r in records), statistics.median(r["step_time"] for r in records)


def step_cpu_seconds(model: str, chunk: int, steps: int) -> float:
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=[*MODELS[model], *SHAPES, f"model.loss_chunk_tokens={chunk}"])
    net = ModelFactory(cfg)().train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    tokens = torch.randint(0, cfg.model.vocab_size, (8, cfg.data.seq_len + 1), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps + 1):
        start = time.process_time()
        cross_entropy(net(tokens[:, :-1]), tokens[:, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.process_time() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    print("vocab 32000, seq 512, micro-batch 8 (4,096 tokens), fp32, one process")
    print(f"{'model':6} {'chunk':>6} {'memory_gb':>10} {'wall_s':>8} {'vs whole':>9} {'cpu_s 1 thread':>15} {'vs whole':>9}")
    for model in MODELS:
        rows = {}
        for chunk in (0, *args.chunks):
            memory, wall = job_memory_and_step(model, chunk, args.steps)
            torch.set_num_threads(1)
            rows[chunk] = memory, wall, step_cpu_seconds(model, chunk, args.steps)
        _, wall0, cpu0 = rows[0]
        for chunk, (memory, wall, cpu) in rows.items():
            print(f"{model:6} {chunk or 'whole':>6} {memory:10.2f} {wall:8.3f} {wall / wall0:8.2f}x {cpu:15.3f} "
                  f"{cpu / cpu0:8.2f}x")


if __name__ == "__main__":
    main()
