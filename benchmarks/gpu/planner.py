"""The planner's step time, with the job's model timed on this GPU (`python -m framework.plan`, issue 32's
on-device timing), against the measured one for five jobs of the honest stages: parallel=single eager and
compiled, ddp, fsdp stage 3 compiled, deepspeed stage 3 (870M Llama, one rank). The measured step is the
profiler trace's, read from the honest stages' rows in this call's --out or a --reuse folder; a job without
one is measured here first, the same way. planned/measured within 0.90-1.10 is the mark.
Estimate on one H100: a plan ~25 s (start, the op trace, timing the 2- and 3-block models), ~45 s where it
compiles them: 25 + 45 + 25 + 45 + 25 = 165 s with the honest rows at hand; a job measured here adds its
honest estimate (30-80 s).
"""
from __future__ import annotations

import json
import sys

from benchmarks.gpu import honest
from benchmarks.gpu.processes import run_process
from benchmarks.gpu.stage import Column, Job, Session, Stage, StageRun

FIVE = ("single", "single compile", "ddp", "fsdp_z3 compile", "ds_z3")
DRY = ("single",)
PLAN_S = {False: 25, True: 45}


def measured_row(session: Session, job: str) -> dict | None:
    """The honest stages' row of `job` with a trace, where one was written."""
    for stage in honest.STAGES:
        for row in session.rows(stage.name):
            if row["job"] == job and row.get("trace_s"):
                return row
    return None


def plan_job(name: str, measured: dict | None) -> Job:
    job = honest.JOBS[name]
    estimate = PLAN_S[job.compiled] + (0 if measured else job.gpu_s)

    def measure(run: StageRun) -> None:
        row = measured or measured_row(run.session, name)
        if row is None:          # measured here, into this stage's rows
            job.measure(run)
            row = run.earlier(name)
            if row is None or not row.get("trace_s"):
                return
        done = run_process([sys.executable, "-m", "framework.plan", "--json", *run.overrides(job.args(run.dry_run))],
                           run.left_s())
        if not done.ok:
            run.failed(f"plan {name}", done)
            return
        plan = json.loads(done.stdout.strip().splitlines()[-1])
        run.row(f"plan {name}", planned_s=plan["step_time_s"], measured_s=row["trace_s"],
                planned_over_measured=plan["step_time_s"] / row["trace_s"], step_time_from=plan["step_time_from"],
                planned_gib=plan["per_rank_bytes"]["total"] / 2**30, measured_gib=row.get("allocated_gib"),
                measured_in=row["stage"], wall_s=round(done.wall_s, 1))
    return Job(f"plan {name}", estimate, measure, dry=name in DRY)


def _jobs(session: Session) -> list[Job]:
    return [plan_job(name, measured_row(session, name)) for name in FIVE]


COLUMNS = (Column("planned_s", "planned s", ".4f"), Column("measured_s", "measured s", ".4f"),
           Column("planned_over_measured", "plan/meas", ".3f"), Column("planned_gib", "plan GiB", ".2f"),
           Column("measured_gib", "meas GiB", ".2f"), Column("step_time_from", "step time from"))
STAGE = Stage("planner", "the planner's on-device step time against the measured one, five jobs", COLUMNS, _jobs)
