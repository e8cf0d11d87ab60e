"""The GPU session: the named stages, in the order named, within --seconds (counted from GPU_SESSION_STARTED,
which benchmarks/gpu_session.sh sets before it installs the wheels).

    python -m benchmarks.gpu.session --out DIR [--seconds 540] [--dry-run] [--reuse DIR ...] STAGE ...
    python -m benchmarks.gpu.session --list

STAGE is a stage's name, `honest` (its four stages) or `all` (every stage, highest value first; a GPU call
runs at most 7, since the device tool brings back 8 files). A stage whose estimate does not fit in what is
left is skipped with a line saying so; one that starts runs at most four minutes. Each stage prints its table as its jobs finish and appends its rows to DIR/<stage>.jsonl;
everything printed also goes to DIR/session.log. --dry-run runs every stage on this machine's CPU at tiny
sizes (the code the GPU runs, with a model of a few thousand parameters and no compilation).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks.gpu import checkpoints, float8_speed, honest, kernels, planner
from benchmarks.gpu.processes import device_description
from benchmarks.gpu.stage import STAGE_LIMIT_S, Session, Stage, run_stage, skip_stage
from framework.exit_codes import USAGE

#: highest value first (issue 45): honest numbers, checkpoints and determinism, float8 / cp / MoE, the planner
STAGES: dict[str, Stage] = {stage.name: stage for stage in (*honest.STAGES, checkpoints.STAGE, float8_speed.STAGE,
                                                            kernels.STAGE, planner.STAGE)}
GROUPS = {"honest": [stage.name for stage in honest.STAGES], "all": list(STAGES)}
MAX_STAGES = 7          # a device call brings back 8 files: one .jsonl a stage, and session.log


def chosen(names: list[str]) -> list[Stage]:
    """The stages the names ask for, in the order named, each once; unknown names raise ValueError."""
    picked: list[str] = []
    for name in names:
        for one in GROUPS.get(name, [name]):
            if one not in STAGES:
                raise ValueError(f"unknown stage {name!r}: one of {', '.join([*STAGES, *GROUPS])}")
            if one not in picked:
                picked.append(one)
    return [STAGES[name] for name in picked]


def run_stages(stages: list[Stage], session: Session, environment: dict) -> None:
    for stage in stages:
        need, left = stage.estimate_s(session), session.left_s()
        if need > left:
            skip_stage(stage, session, f"needs about {need:.0f} s, {left:.0f} s left of the session")
        else:
            run_stage(stage, session, environment)


class Log:
    """Every line to the console and to DIR/session.log, flushed at once (a call cut short keeps it)."""

    def __init__(self, path: Path):
        self.file = open(path, "a")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def listing(dry_run: bool) -> str:
    session = Session(out=Path("."), dry_run=dry_run, deadline=0.0)
    where = "this CPU, tiny sizes" if dry_run else "one H100"
    lines = [f"{'stage':<15}{'about s':>8}  what (each at most {STAGE_LIMIT_S:.0f} s; estimates on {where})"]
    for stage in STAGES.values():
        lines.append(f"{stage.name:<15}{stage.estimate_s(session):>8.0f}  {stage.what}")
    groups = "; ".join(f"{name} = {' '.join(members)}" for name, members in GROUPS.items())
    return "\n".join([*lines, f"groups: {groups}"])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seconds", type=float, default=540.0, help="the session's time, start-up included")
    ap.add_argument("--dry-run", action="store_true", help="every stage on this CPU at tiny sizes")
    ap.add_argument("--reuse", type=Path, action="append", default=[], help="an earlier call's results folder")
    ap.add_argument("--list", action="store_true", help="the stages, their estimates, and stop")
    opts = ap.parse_args(argv)
    if opts.list:
        print(listing(opts.dry_run))
        return 0
    try:
        stages = chosen(opts.stages)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE
    if not stages or opts.out is None:
        print("error: name --out DIR and at least one stage (--list shows them)", file=sys.stderr)
        return USAGE
    if not opts.dry_run and len(stages) > MAX_STAGES:
        print(f"error: {len(stages)} stages in one call; at most {MAX_STAGES}: the device tool brings back 8 files, "
              f"one a stage and the log", file=sys.stderr)
        return USAGE
    environment = device_description()
    if not opts.dry_run and environment["gpu"] is None:
        print("error: no GPU here (nvidia-smi finds none); --dry-run runs the stages on this CPU", file=sys.stderr)
        return USAGE
    started = float(os.environ.get("GPU_SESSION_STARTED", time.time()))
    deadline = time.monotonic() + opts.seconds - (time.time() - started)
    opts.out.mkdir(parents=True, exist_ok=True)
    say = Log(opts.out / "session.log")
    session = Session(out=opts.out, dry_run=opts.dry_run, deadline=deadline, reuse=tuple(opts.reuse), say=say)
    say(f"GPU session: {environment['gpu'] or 'CPU (dry run)'}, torch {environment['torch']}, commit "
        f"{environment['commit']}; {session.left_s():.0f} s for {' '.join(s.name for s in stages)}")
    run_stages(stages, session, environment)
    say(f"GPU session: done, {session.left_s():.0f} s left")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
