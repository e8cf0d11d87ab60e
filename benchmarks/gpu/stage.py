"""What a stage is: jobs in order of value, each with what it costs on one H100, run within the stage's
time; each row a job yields is printed under the stage's table header and appended to DIR/<stage>.jsonl
the moment it exists, so a call cut short keeps every finished row."""
from __future__ import annotations

import json
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.gpu.processes import Finished, run_framework
from benchmarks.gpu.shapes import QUIET

#: the longest a stage may run: a device call is at most 10 minutes, and a stage that runs past this is
#: one whose table may be lost to the call's end
STAGE_LIMIT_S = 240.0
#: what a job costs in a --dry-run (a tiny model on a loaded two-core dev machine's CPU)
DRY_JOB_S = 20.0


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    fmt: str = ""           # format spec of a number, e.g. ".3f"; a bool shows yes/NO, None shows -

    def show(self, value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "NO"
        if isinstance(value, (int, float)) and self.fmt:
            return format(value, self.fmt)
        return str(value)


@dataclass(frozen=True)
class Job:
    name: str
    gpu_s: float                        # about this long on one H100: start, model build, compile, steps
    run: Callable[["StageRun"], None]   # yields its rows through StageRun.row
    dry: bool = True                    # also runs in a --dry-run

    def estimate_s(self, dry_run: bool) -> float:
        return DRY_JOB_S if dry_run else self.gpu_s


@dataclass(frozen=True)
class Stage:
    name: str
    what: str                           # one line: what it measures
    columns: tuple[Column, ...]
    jobs: Callable[["Session"], list[Job]]     # in order of value: a job that would not fit is left out

    def planned(self, session: "Session") -> list[Job]:
        return [job for job in self.jobs(session) if job.dry or not session.dry_run]

    def estimate_s(self, session: "Session") -> float:
        return sum(job.estimate_s(session.dry_run) for job in self.planned(session))


@dataclass
class Session:
    out: Path                           # DIR: <stage>.jsonl and session.log
    dry_run: bool                       # tiny models on the CPU
    deadline: float                     # time.monotonic() by which everything must have ended
    reuse: tuple[Path, ...] = ()        # earlier calls' result dirs, read for rows measured there
    say: Callable[[str], None] = print  # a line to the console and the log

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def rows(self, stage: str) -> list[dict]:
        """The rows a stage wrote into this call's results or an earlier call's (this call's first)."""
        found = []
        for folder in (self.out, *self.reuse):
            path = Path(folder) / f"{stage}.jsonl"
            if path.exists():
                found += [row for row in map(json.loads, path.read_text().splitlines()) if row.get("kind") == "row"]
        return found


class StageRun:
    """One stage while it runs: its deadline, its scratch folder, and the rows it has written."""

    def __init__(self, stage: Stage, session: Session, deadline: float, scratch: Path):
        self.stage, self.session, self.deadline, self.scratch = stage, session, deadline, scratch
        self.path = session.out / f"{stage.name}.jsonl"
        self.written: list[dict] = []

    @property
    def dry_run(self) -> bool:
        return self.session.dry_run

    @property
    def device(self) -> str:
        return self.session.device

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, kind: str, **fields) -> dict:
        line = {"kind": kind, "stage": self.stage.name, **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        return line

    def row(self, job: str, **fields) -> None:
        """One row of the stage's table: written, then printed."""
        self.written.append(self.record("row", job=job, **fields))
        cells = [self._cell(col, fields.get(col.key)) for col in self.stage.columns]
        line = f"{job:<24}" + "".join(cells)
        if fields.get("error"):
            line = f"{job:<24}FAILED: {fields['error']}"
        elif fields.get("skipped"):
            line = f"{job:<24}skipped: {fields['skipped']}"
        elif fields.get("refused"):
            line = f"{job:<24}refused before launch: {fields['refused']}"
        self.session.say(line)
        for tail in fields.get("log_tail") or ():
            self.session.say(f"    | {tail}")

    def overrides(self, args: list[str]) -> list[str]:
        """A job's whole command line: QUIET, this stage's device, then ARGS."""
        return [*QUIET, f"device={self.device}", *args]

    def framework(self, job: str, args: list[str], run_dir: Path | None = None) -> Finished:
        """`python -m framework` with overrides(ARGS), within what is left of the stage; its run dir (by
        default one named after the job) stays in the stage's scratch folder until the stage ends."""
        run_dir = run_dir or self.scratch / job.replace(" ", "_")
        return run_framework(self.overrides(args), run_dir, self.left_s())

    def failed(self, job: str, done: Finished, **fields) -> None:
        self.row(job, error=done.failure(), log_tail=done.tail(), wall_s=round(done.wall_s, 1), **fields)

    def earlier(self, job: str) -> dict | None:
        """This stage's row of `job`, where it finished without error."""
        return next((r for r in self.written if r["job"] == job and not r.get("error") and not r.get("skipped")),
                    None)

    def header(self) -> None:
        self.session.say(f"{'job':<24}" + "".join(self._cell(col, col.title) for col in self.stage.columns))

    @staticmethod
    def _cell(col: Column, value) -> str:
        text = value if isinstance(value, str) else col.show(value)
        return f" {text:>{max(len(col.title), 8) + 1}}"


def run_stage(stage: Stage, session: Session, environment: dict) -> None:
    """Every job of the stage that fits in what is left of it, in order; a job that raises is a row too."""
    limit = min(STAGE_LIMIT_S, session.left_s())
    start = time.monotonic()
    jobs = stage.planned(session)
    estimate = stage.estimate_s(session)
    where = "this CPU, tiny sizes" if session.dry_run else "one H100"
    with tempfile.TemporaryDirectory(prefix=f"gpu-{stage.name}-") as scratch:
        run = StageRun(stage, session, start + limit, Path(scratch))
        session.say(f"== {stage.name}: {stage.what}; about {estimate:.0f} s on {where}, at most {limit:.0f} s")
        run.record("env", dry_run=session.dry_run, **environment)
        run.header()
        for job in jobs:
            need, left = job.estimate_s(session.dry_run), run.left_s()
            if need > left:
                run.row(job.name, skipped=f"needs about {need:.0f} s, {left:.0f} s left in the stage")
                continue
            try:
                job.run(run)
            except Exception as e:      # noqa: BLE001 - a broken job is a row, and the next job runs
                lines = traceback.format_exc().strip().splitlines()
                run.row(job.name, error=f"{type(e).__name__}: {e}"[:300], log_tail=lines[-8:])
    session.say(f"== {stage.name}: done in {time.monotonic() - start:.0f} s")


def skip_stage(stage: Stage, session: Session, why: str) -> None:
    session.say(f"== {stage.name}: skipped: {why}")
    with open(session.out / f"{stage.name}.jsonl", "a") as f:
        f.write(json.dumps({"kind": "skipped", "stage": stage.name, "why": why}) + "\n")
