"""float8 against bf16, both compiled, on the 2.9B Llama (B3: 4 x 2048 tokens a step, activation
checkpointing full, as the H100 rows ran it), parallel=single: tokens/s (median of steps 6-15, every step
logged), MFU (against the bf16 peak for both, so float8's gain shows) and peak memory. float8/bf16 is the
speed-up; the goal is at least 1.20. A CPU dry run trains the tiny Llama eager, float8 emulated.
Estimate on one H100: each job ~10 s to start, ~10 s to build 2.9B parameters, ~60 s to compile 26
blocks, 15 steps ~10 s: 2 x 95 = 190 s.
"""
from __future__ import annotations

import statistics

from benchmarks.gpu.shapes import B3, TINY
from benchmarks.gpu.stage import Column, Job, Session, Stage, StageRun

STEPS, WARMUP = 15, 5
GPU_SHAPE = [*B3, "activation_checkpointing=full", "trainer.global_batch_size=4"]
DRY_SHAPE = [*TINY, "trainer.global_batch_size=4"]
PRECISIONS = {"bf16": ["precision=bf16"], "float8": ["precision=float8"]}
DRY_EXTRA = {"float8": ["precision.float8_emulate=true"]}     # a CPU has no float8 matmuls


def speed(precision: str, dry_run: bool) -> Job:
    compiled = not dry_run
    name = f"{precision}{' compile' if compiled else ''}"

    def measure(run: StageRun) -> None:
        args = [*(DRY_SHAPE if dry_run else GPU_SHAPE), *PRECISIONS[precision],
                *(DRY_EXTRA.get(precision, []) if dry_run else []), f"trainer.compile={str(compiled).lower()}",
                f"trainer.max_steps={STEPS}", "trainer.log_every=1", "checkpoint.enabled=false"]
        done = run.framework(name, args)
        if not done.ok:
            run.failed(name, done)
            return
        steady = [r for r in done.records if r["step"] > WARMUP]
        fields = {"tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in steady),
                  "step_s": statistics.median(r["step_time"] for r in steady),
                  "mfu": statistics.median(r["mfu"] for r in steady),
                  "allocated_gib": max(r["memory_gb"] for r in steady),
                  "compile_s": sum(r.get("compile_time", 0.0) for r in done.records)}
        base = run.earlier(f"bf16{' compile' if compiled else ''}")
        if precision != "bf16":
            fields["float8_over_bf16"] = fields["tokens_per_sec"] / base["tokens_per_sec"] if base else None
        run.row(name, **fields, wall_s=round(done.wall_s, 1))
    return Job(name, 95, measure)


COLUMNS = (Column("tokens_per_sec", "tokens/s", ",.0f"), Column("step_s", "step s", ".3f"), Column("mfu", "MFU", ".1%"),
           Column("float8_over_bf16", "float8/bf16", ".3f"), Column("allocated_gib", "alloc GiB", ".2f"),
           Column("compile_s", "compile s", ".0f"), Column("wall_s", "wall s", ".0f"))


def _jobs(session: Session) -> list[Job]:
    return [speed(precision, session.dry_run) for precision in PRECISIONS]


STAGE = Stage("float8", "float8 against bf16, both compiled, 2.9B Llama, one GPU", COLUMNS, _jobs)
