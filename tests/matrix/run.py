"""Runs matrix jobs as ONE Hydra multirun of the real entrypoint (`python -m framework -m`), so that
every job pays no interpreter start and workers fork from one preloaded server, as a user's sweep does.

Each job becomes a config file of its own (`+matrix_job=jNNN`, `# @package _global_`, its group choices as
`override /group: option` and its keys as values), so jobs that differ in every option still run as points
of one sweep; point i of the sweep runs job i in <root>/runs/i.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import REPO, run_in_own_session


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


def run_sweep(jobs: list[list[str]], root: Path, timeout: float, env: dict | None = None) -> tuple[list[Path], subprocess.CompletedProcess]:
    """Run every job (a list of overrides) as one multirun under `root`; the run dir of each job, in order."""
    conf = root / "conf" / "matrix_job"
    conf.mkdir(parents=True, exist_ok=True)
    names = []
    for i, overrides in enumerate(jobs):
        (conf / f"j{i:03d}.yaml").write_text(job_file(overrides))
        names.append(f"j{i:03d}")
    runs = point_dir(root, 0).parent
    cmd = [sys.executable, "-m", "framework", "-m", f"+matrix_job={','.join(names)}",
           f"hydra.searchpath=[file://{root / 'conf'}]", f"hydra.sweep.dir={runs}", "hydra.sweep.subdir=${hydra.job.num}"]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = run_in_own_session(cmd, cwd=root, env=full_env, timeout=timeout)
    (root / "sweep.log").write_text(proc.stdout + "\n---- stderr ----\n" + proc.stderr)
    return [point_dir(root, i) for i in range(len(jobs))], proc
