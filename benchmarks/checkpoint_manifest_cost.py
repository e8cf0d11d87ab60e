"""What the checkpoint manifest (size + CRC-32 of every file) adds to a save, and what a signed save's
manifest (CRC-32 and SHA-256, in the same read: FRAMEWORK_CHECKPOINT_KEY set) adds.

Saves a model-sized state dict with torch.distributed.checkpoint (one process), then builds both manifests
over the files just written, in alternating order; interleaved rounds, median and spread of each.
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
    times = {"dcp save": [], "manifest": [], "signed": []}
    for round_ in range(args.rounds):
        out = tempfile.mkdtemp(prefix="fw-manifest-")
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=out)
        times["dcp save"].append(time.perf_counter() - start)
        for sha256 in ((False, True) if round_ % 2 == 0 else (True, False)):
            start = time.perf_counter()
            build_manifest(out, sha256=sha256)
            times["signed" if sha256 else "manifest"].append(time.perf_counter() - start)
        shutil.rmtree(out)
    for name, xs in times.items():
        print(f"{name:9s} median {statistics.median(xs):.3f} s  (min {min(xs):.3f}, max {max(xs):.3f})")
    for name in ("manifest", "signed"):
        ratio = [m / s for m, s in zip(times[name], times["dcp save"])]
        print(f"{name} / save: median {statistics.median(ratio):.1%} (min {min(ratio):.1%}, max {max(ratio):.1%}); "
              f"{args.mb / statistics.median(times[name]):.0f} MB/s")
    extra = [(s - m) / d for s, m, d in zip(times["signed"], times["manifest"], times["dcp save"])]
    print(f"SHA-256 beyond the CRC-32 manifest, / save: median {statistics.median(extra):.1%} "
          f"(min {min(extra):.1%}, max {max(extra):.1%})")


if __name__ == "__main__":
    main()
