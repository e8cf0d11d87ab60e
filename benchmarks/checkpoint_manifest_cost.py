"""What the checkpoint manifest (size + CRC-32 of every file) adds to a save.

Saves a model-sized state dict with torch.distributed.checkpoint (one process), then builds the manifest
over the files just written; interleaved rounds, median and spread of each.
    python benchmarks/checkpoint_manifest_cost.py --mb 256 --rounds 5
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from framework.checkpoint.manifest import build_manifest  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.mb * (1 << 20) // 4
    state = {f"layer{i}.weight": torch.randn(n // 8) for i in range(8)}
    save_s, manifest_s = [], []
    for _ in range(args.rounds):
        out = tempfile.mkdtemp(prefix="fw-manifest-")
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=out)
        save_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        build_manifest(out)
        manifest_s.append(time.perf_counter() - start)
        shutil.rmtree(out)
    for name, xs in (("dcp save", save_s), ("manifest", manifest_s)):
        print(f"{name:9s} median {statistics.median(xs):.3f} s  (min {min(xs):.3f}, max {max(xs):.3f})")
    ratio = [m / s for m, s in zip(manifest_s, save_s)]
    print(f"manifest / save: median {statistics.median(ratio):.1%} (min {min(ratio):.1%}, max {max(ratio):.1%}); "
          f"{args.mb / statistics.median(manifest_s):.0f} MB/s")


if __name__ == "__main__":
    main()
