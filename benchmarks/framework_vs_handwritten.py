"""Throughput of `python -m framework` next to a hand-written loop on the same model, data and batch.

    python benchmarks/framework_vs_handwritten.py [--steps 40] [--model small] [--seq-len 128] [--batch 16]

Both sides train the same Llama on the same sequences with AdamW; the first steps are dropped as
warm-up. Prints tokens/s of each and the ratio (framework / hand-written; 1.0 = no overhead).
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

import torch
import torch.nn.functional as F
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from framework.config.paths import CONFIG_DIR  # noqa: E402
from framework.data.batches import GlobalBatchSampler, split_train_val  # noqa: E402
from framework.data.sources import pydoc_corpus_bytes  # noqa: E402
from framework.models.llama import Llama, init_weights  # noqa: E402


def handwritten(model_cfg: dict, seq_len: int, batch: int, steps: int, warmup: int) -> float:
    model = Llama(**model_cfg)
    init_weights(model, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    import numpy as np
    tokens, _ = split_train_val(np.frombuffer(pydoc_corpus_bytes(), dtype=np.uint8), 0.05)
    data = GlobalBatchSampler(tokens, seq_len, batch, seed=0)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        seqs = data.local_batch(step, 0, 1)
        logits = model(seqs[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), seqs[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)
        times.append(time.perf_counter() - start)
    return batch * seq_len / statistics.median(times[warmup:])


def framework(model: str, seq_len: int, batch: int, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run([sys.executable, "-m", "framework", f"model={model}", f"data.seq_len={seq_len}",
                        f"trainer.global_batch_size={batch}", f"trainer.micro_batch_size={batch}",
                        f"trainer.max_steps={steps}", "trainer.log_every=1", "trainer.eval_every=0",
                        "trainer.progress_bar=false", "logging.tensorboard=false", "checkpoint.enabled=false",
                        f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, capture_output=True)
        records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    return statistics.median(r["tokens_per_sec"] for r in records[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    model_cfg = yaml.safe_load((CONFIG_DIR / "model" / f"{args.model}.yaml").read_text())
    model_cfg = {k: v for k, v in model_cfg.items() if k not in ("defaults", "_target_")}
    hand = handwritten(model_cfg, args.seq_len, args.batch, args.steps, args.warmup)
    ours = framework(args.model, args.seq_len, args.batch, args.steps, args.warmup)
    print(f"{'':24}{'tokens/s':>12}")
    print(f"{'hand-written loop':24}{hand:12.0f}")
    print(f"{'python -m framework':24}{ours:12.0f}")
    print(f"{'ratio (framework/hand)':24}{ours / hand:12.3f}")


if __name__ == "__main__":
    main()
