"""Periodic background checkpoints on the GPU, and trainer.deterministic: repeats and resume.

For parallel=single and parallel=fsdp (stage 3, one rank), llama_125m at 8 x 1024 tokens, bf16, seed 4,
trainer.deterministic=true, 12 steps, every step logged:
  async saves     checkpoint.async_save=true every 4 steps: exit 0, saves at 4, 8 and 12; each one intact
                  (its manifest), loadable (every weight read back, all finite) and distinct from the one
                  before (each holds its own step's weights, not a reused staging buffer)
  repeat          the same job again without saves: every step's loss and grad norm identical
  resumed at 8    from the async run's step-8 save, to 12: steps 9-12 exactly the uninterrupted ones
  deterministic off  tokens/s without the switch; det cost = tokens/s with it over without (GPU only)
Estimates on one H100 (a job's start ~10 s, the model ~5 s, 12 steps ~5 s): single 30 + 20 + 20, fsdp
35 + 25 + 25, the two deterministic-off jobs 20 + 25 = 200 s.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

from benchmarks.gpu.shapes import TINY
from benchmarks.gpu.stage import Column, Job, Stage, StageRun

GPU_SHAPE = ["model=llama_125m", "data.seq_len=1024", "precision=bf16", "trainer.global_batch_size=8"]
DRY_SHAPE = [*TINY, "precision=fp32", "trainer.global_batch_size=4"]
STEPS, INTERVAL, RESUME_AT = 12, 4, 8
LAYOUTS = {"single": ["parallel=single"], "fsdp": ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=1"]}
DETERMINISTIC = [f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.deterministic=true", "seed=4"]


def _args(run: StageRun, layout: str, *extra: str) -> list[str]:
    return [*(DRY_SHAPE if run.dry_run else GPU_SHAPE), *LAYOUTS[layout], *DETERMINISTIC, *extra]


def _curve(records: list[dict]) -> dict[int, tuple]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


def first_difference(a: dict, b: dict) -> str | None:
    for step in sorted(set(a) | set(b)):
        if a.get(step) != b.get(step):
            return f"step {step}: (loss, grad_norm) {a.get(step)} vs {b.get(step)}"
    return None


def _tokens_per_sec(records: list[dict]) -> float | None:
    later = [r["tokens_per_sec"] for r in records if r["step"] > 4]
    return statistics.median(later) if later else None


def _async_dir(run: StageRun, layout: str) -> Path:
    return run.scratch / f"{layout}_async_saves"


def async_saves(layout: str) -> Job:
    name = f"{layout} async saves"

    def measure(run: StageRun) -> None:
        from framework.checkpoint.names import complete_checkpoints
        done = run.framework(name, _args(run, layout, "checkpoint.enabled=true", "checkpoint.async_save=true",
                                         f"checkpoint.interval={INTERVAL}", "checkpoint.keep_last=3"),
                             run_dir=_async_dir(run, layout))
        saves = [Path(p) for p in complete_checkpoints(str(_async_dir(run, layout) / "checkpoints"))]
        steps = [int(p.name.split("_")[-1]) for p in saves]
        if not done.ok:
            run.failed(name, done, saves=",".join(map(str, steps)))
            return
        run.row(name, saves=",".join(map(str, steps)), all_saves=steps == list(range(INTERVAL, STEPS + 1, INTERVAL)),
                tokens_per_sec=_tokens_per_sec(done.records), save_s=sum(r.get("save_time", 0.0) for r in done.records),
                wall_s=round(done.wall_s, 1))
        previous = None
        for step, path in zip(steps, saves):
            fields, previous = check_save(path, previous)
            run.row(f"{layout} save step {step}", **fields)
    return Job(name, 30 if layout == "single" else 35, measure, dry=layout == "single")


def check_save(path: Path, previous_digest: str | None) -> tuple[dict, str | None]:
    """(row fields, digest of its weights): intact, every weight read back and finite, not the one before."""
    import torch

    from framework.checkpoint.resume import check_intact
    from framework.export.read import read_dcp
    try:
        check_intact(str(path))
        weights = read_dcp(str(path))
    except Exception as e:      # noqa: BLE001 - what made it unloadable is the finding
        return {"intact": False, "loadable": False, "why": f"{type(e).__name__}: {e}"[:300]}, previous_digest
    finite = all(bool(torch.isfinite(t).all()) for t in weights.values())
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(weights[key].contiguous().numpy().tobytes())
    distinct = previous_digest is None or digest.hexdigest() != previous_digest
    why = None if finite and distinct else ("a weight is not finite" if not finite else "the same weights as the save before")
    return {"intact": True, "loadable": finite, "tensors": len(weights), "distinct": distinct, "why": why}, digest.hexdigest()


def repeat(layout: str) -> Job:
    name = f"{layout} repeat"

    def measure(run: StageRun) -> None:
        done = run.framework(name, _args(run, layout, "checkpoint.enabled=false"))
        if not done.ok:
            run.failed(name, done)
            return
        first = run.earlier(f"{layout} async saves")
        reference = _curve(_records(_async_dir(run, layout))) if first else {}
        again = _curve(done.records)
        difference = first_difference(reference, again) if first else "the async-save run has no row"
        run.row(name, identical=difference is None and len(again) == STEPS, why=difference,
                tokens_per_sec=_tokens_per_sec(done.records), wall_s=round(done.wall_s, 1))
    return Job(name, 20 if layout == "single" else 25, measure, dry=layout == "single")


def resumed(layout: str) -> Job:
    name = f"{layout} resumed at {RESUME_AT}"

    def measure(run: StageRun) -> None:
        from framework.checkpoint.names import step_dir_name
        save = _async_dir(run, layout) / "checkpoints" / step_dir_name(RESUME_AT)
        if not save.exists():
            run.row(name, skipped=f"no step-{RESUME_AT} save from the async-save run")
            return
        done = run.framework(name, _args(run, layout, "checkpoint.enabled=false", f"checkpoint.resume={save}"))
        if not done.ok:
            run.failed(name, done)
            return
        uninterrupted = {s: v for s, v in _curve(_records(_async_dir(run, layout))).items() if s > RESUME_AT}
        again = _curve(done.records)
        difference = first_difference(uninterrupted, again)
        run.row(name, equal=difference is None and len(again) == STEPS - RESUME_AT, why=difference,
                wall_s=round(done.wall_s, 1))
    return Job(name, 20 if layout == "single" else 25, measure, dry=layout == "single")


def deterministic_off(layout: str) -> Job:
    name = f"{layout} deterministic off"

    def measure(run: StageRun) -> None:
        args = [a for a in _args(run, layout, "checkpoint.enabled=false") if a != "trainer.deterministic=true"]
        done = run.framework(name, [*args, "trainer.deterministic=false"])
        if not done.ok:
            run.failed(name, done)
            return
        on, off = run.earlier(f"{layout} repeat"), _tokens_per_sec(done.records)
        run.row(name, tokens_per_sec=off, deterministic_cost=on["tokens_per_sec"] / off if on and off else None,
                wall_s=round(done.wall_s, 1))
    return Job(name, 20 if layout == "single" else 25, measure, dry=False)


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


COLUMNS = (Column("saves", "saves"), Column("loadable", "loadable"), Column("distinct", "distinct"),
           Column("identical", "identical"), Column("equal", "equal"), Column("tokens_per_sec", "tokens/s", ",.0f"),
           Column("deterministic_cost", "det cost", ".2f"), Column("wall_s", "wall s", ".0f"), Column("why", "why"))
STAGE = Stage("checkpoints", "periodic async saves (each loadable), trainer.deterministic repeats and resume",
              COLUMNS, lambda session: [*(job(layout) for layout in LAYOUTS for job in (async_saves, repeat, resumed)),
                                        *(deterministic_off(layout) for layout in LAYOUTS)])
