"""Runs matrix jobs as ONE Hydra multirun of the real entrypoint (`python -m framework -m`), so that
every job pays no interpreter start and workers fork from one preloaded server, as a user's sweep does.

Each job becomes a config file of its own (`+matrix_job=jNNN`, `# @package _global_`, its group choices as
`override /group: option` and its keys as values), so jobs that differ in every option still run as points
of one sweep; point i of the sweep runs job i in <root>/runs/i.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.harness.helpers import REPO


def job_file(overrides: list[str]) -> str:
    """`group=option` and `a.b=v` overrides as a global-package config file."""
    groups, values = [], {}
    for override in overrides:
        key, _, value = override.partition("=")
        if "." not in key:
            groups.append({f"override /{key}": value})
            continue
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value) if value != "" else ""
    return "# @package _global_\n" + yaml.safe_dump({"defaults": groups, **values}, sort_keys=False)


def point_dir(root: Path, i: int) -> Path:
    """Where point i of the sweep under `root` runs (hydra.sweep.dir is its parent)."""
    return root / "runs" / str(i)


@dataclass
class Sweep:
    """A multirun started in its own session, writing its output to <root>/sweep.log."""
    dirs: list[Path]                    # the run dir of each job, in order
    proc: subprocess.Popen
    log: Path

    def wait(self, timeout: float) -> int:
        """The sweep's exit code; on timeout the whole session goes (every point's workers too)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


#: tests/matrix/plugins/hydra_plugins/matrix_sweeper.py, chosen as hydra/sweeper=matrix
SWEEPER = Path(__file__).with_name("plugins")
SWEEPER_CONFIG = "_target_: hydra_plugins.matrix_sweeper.PlannedSweeper\nmax_batch_size: null\nparams: null\n"


def start_sweep(jobs: list[list[str]], root: Path, env: dict | None = None) -> Sweep:
    """Start every job (a list of overrides) as one multirun under `root`, without waiting for it."""
    conf = root / "conf" / "matrix_job"
    conf.mkdir(parents=True, exist_ok=True)
    sweeper = root / "conf" / "hydra" / "sweeper"
    sweeper.mkdir(parents=True, exist_ok=True)
    (sweeper / "matrix.yaml").write_text(SWEEPER_CONFIG)
    names = []
    for i, overrides in enumerate(jobs):
        (conf / f"j{i:03d}.yaml").write_text(job_file(overrides))
        names.append(f"j{i:03d}")
    runs = point_dir(root, 0).parent
    cmd = [sys.executable, "-m", "framework", "-m", f"+matrix_job={','.join(names)}", "hydra/sweeper=matrix",
           f"hydra.searchpath=[file://{root / 'conf'}]", f"hydra.sweep.dir={runs}", "hydra.sweep.subdir=${hydra.job.num}"]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(SWEEPER)]),
                **(env or {})}
    log = root / "sweep.log"
    with open(log, "w") as out:      # a file, not a pipe: nobody reads while the test process plans
        proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Sweep([point_dir(root, i) for i in range(len(jobs))], proc, log)
