"""Kernels: context parallelism's attention on CUDA's flash and memory-efficient kernels, MoE's grouped GEMM
against a loop over experts, and the 8B loss's peak memory whole and in chunks, all in one process
(benchmarks/gpu/kernel_times.py says what each row measures). Rows print as the process writes them.
Estimate on one H100: ~10 s to start, cp ~40 s (32,768 tokens, 2 kernels x 4 degrees, 7 timed runs and one
profiled run each), MoE ~20 s, the loss ~15 s: 85 s.
"""
from __future__ import annotations

import json
import sys

from benchmarks.gpu.processes import run_process
from benchmarks.gpu.stage import Column, Job, Stage, StageRun

MEASURES = ("cp", "moe", "loss_chunk")


def measure(run: StageRun) -> None:
    def row(line: str) -> None:
        if line.startswith("{"):
            fields = json.loads(line)
            run.row(fields.pop("job"), **fields)
    done = run_process([sys.executable, "-m", "benchmarks.gpu.kernel_times", *MEASURES, "--device", run.device,
                        *(["--dry-run"] if run.dry_run else [])], run.left_s(), on_line=row)
    if not done.ok:
        run.failed("kernel timings", done)


COLUMNS = (Column("step_s", "step s", ".5f"), Column("over_ideal", "x ideal", ".2f"),
           Column("grouped_speedup", "grouped x", ".2f"), Column("max_rel_diff", "rel diff", ".1e"),
           Column("whole_gib", "whole GiB", ".2f"), Column("chunked_gib", "chunk GiB", ".2f"),
           Column("ops", "attention ops"), Column("why", "why"))
STAGE = Stage("kernels", "cp attention on flash and memory-efficient kernels, MoE grouped GEMM, loss chunks",
              COLUMNS, lambda session: [Job("kernel timings", 85, measure)])
