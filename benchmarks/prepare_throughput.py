"""Prepare and loader throughput.

    python benchmarks/prepare_throughput.py [--copies 8] [--rounds 3] [--workers 1 2] [--vocab 8192]

1. `framework.data.prepare` tokens/s per worker next to a plain `tokenizers` encode_batch loop (one
   thread, texts already in memory) on the same JSONL corpus (the pydoc topics, `--copies` times) and
   the same tokenizer.json. Goal: >= 0.9 of the loop per worker, near-linear in workers.
2. The data loader (the sampler's local_batch on the prepared, memory-mapped dataset) in tokens/s next
   to what training consumes (tokens_per_sec of `python -m framework model=small` on that dataset).
   Goal: >= 100x.

Rounds interleave the contenders so that load from other processes hits them alike; each line gives
the median and the spread (min-max) over rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["TOKENIZERS_PARALLELISM"] = "false"   # one thread per worker, and one for the plain loop

from tokenizers import Tokenizer  # noqa: E402

from framework.data.batches import build_samplers  # noqa: E402
from framework.data.prepare import BATCH_CHARS, prepare  # noqa: E402
from framework.data.tokenizer import train_bpe  # noqa: E402


def write_corpus(path: Path, copies: int) -> list[str]:
    from pydoc_data.topics import topics
    texts = [topics[k] for k in sorted(topics)] * copies
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return texts


def plain_loop(tokenizer_file: Path, texts: list[str]) -> float:
    """tokens/s of encode_batch over batches of the same size prepare sends to a worker."""
    tok = Tokenizer.from_file(str(tokenizer_file))
    start, tokens, batch, chars = time.perf_counter(), 0, [], 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
            batch, chars = [], 0
    if batch:
        tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
    return tokens / (time.perf_counter() - start)


def prepared(corpus: Path, tokenizer_file: Path, out: Path, workers: int) -> float:
    """tokens/s per worker of the whole prepare (read, tokenize, write shards, checksums)."""
    start = time.perf_counter()
    manifest = prepare([str(corpus)], str(tokenizer_file), str(out), workers=workers)
    return manifest["tokens"] / (time.perf_counter() - start) / workers


def loader(dataset: Path, seq_len: int, batch: int, steps: int) -> float:
    from omegaconf import OmegaConf
    cfg = OmegaConf.create({"source": "tokens", "path": str(dataset), "dtype": "uint16", "seq_len": seq_len,
                            "val_fraction": 0.0, "sources": []})
    sampler, _ = build_samplers(cfg, batch, seed=0, with_val=False)
    start = time.perf_counter()
    for step in range(steps):
        sampler.local_batch(step, 0, 1)
    return steps * batch * seq_len / (time.perf_counter() - start)


def training(dataset: Path, seq_len: int, batch: int, steps: int, run_dir: Path) -> float:
    cmd = [sys.executable, "-m", "framework", "model=small", "data=tokens", f"data.path={dataset}",
           f"data.seq_len={seq_len}", f"trainer.max_steps={steps}", f"trainer.global_batch_size={batch}",
           f"trainer.micro_batch_size={batch}", "trainer.log_every=1", "trainer.eval_every=0",
           "trainer.progress_bar=false", "logging.trackers=[]", "checkpoint.enabled=false",
           f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return statistics.median(r["tokens_per_sec"] for r in records[2:])


def summary(name: str, values: list[float], unit: str = "tokens/s") -> str:
    return (f"{name:<40} {statistics.median(values):>12,.0f} {unit}  "
            f"(spread {min(values):,.0f} - {max(values):,.0f}, {len(values)} rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8, help="pydoc topics repeated this many times")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--train-steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        texts = write_corpus(tmp / "corpus.jsonl", args.copies)
        tokenizer_file = tmp / "tokenizer.json"
        train_bpe(texts[:len(texts) // args.copies], args.vocab).save(str(tokenizer_file))
        results: dict[str, list[float]] = {"plain": [], **{f"w{w}": [] for w in args.workers},
                                           "loader": [], "training": []}
        for r in range(args.rounds):
            results["plain"].append(plain_loop(tokenizer_file, texts))
            for w in args.workers:
                results[f"w{w}"].append(prepared(tmp / "corpus.jsonl", tokenizer_file, tmp / f"ds_{r}_{w}", w))
            dataset = tmp / f"ds_{r}_{args.workers[0]}"
            results["loader"].append(loader(dataset, args.seq_len, args.batch, steps=200))
            results["training"].append(training(dataset, args.seq_len, args.batch, args.train_steps, tmp / f"run_{r}"))
        tokens = json.load(open(tmp / f"ds_0_{args.workers[0]}" / "manifest.json"))["tokens"]
    plain = statistics.median(results["plain"])
    print(f"corpus: {len(texts)} documents, {tokens:,} tokens (BPE {args.vocab}); cpus: {os.cpu_count()}; "
          f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(summary("plain encode_batch loop (1 thread)", results["plain"]))
    for w in args.workers:
        per_worker = statistics.median(results[f"w{w}"])
        print(summary(f"prepare --workers {w} (per worker)", results[f"w{w}"]) +
              f"  ratio to plain {per_worker / plain:.2f}")
    loader_tps, train_tps = statistics.median(results["loader"]), statistics.median(results["training"])
    print(summary(f"loader (seq {args.seq_len} x batch {args.batch})", results["loader"]))
    print(summary("training consumes (model=small)", results["training"]) +
          f"  loader / training {loader_tps / train_tps:,.0f}x")


if __name__ == "__main__":
    main()
