"""Hydra's submitit launcher: each sweep point a multi-process job with single's losses, grad norms and
weights, and the sbatch script a 2-node SLURM job would get (no SLURM here: a fake sbatch keeps the
script)."""
import os
import stat
from pathlib import Path

import pytest

from tests.harness.helpers import FAST, SAVE_LAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

LRS = ("1e-3", "2e-3")
ARGS = [*(a for a in FAST if not a.startswith("optimizer.lr")), SAVE_LAST]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("submitit")
    proc = run_framework(["-m", "hydra/launcher=local", "launcher.nproc_per_node=2", *ARGS, "parallel=ddp",
                          f"optimizer.lr={','.join(LRS)}", f"hydra.sweep.dir={sweep}"], timeout=600)
    check_ok(proc)
    return sweep


@pytest.mark.parametrize("point,lr", list(enumerate(LRS)))
def test_each_sweep_point_is_a_two_rank_job_with_single_losses(tmp_path, local_sweep, point, lr):
    run_dir = local_sweep / str(point)
    got = losses(run_dir)
    assert len(got) == 8          # one rank logs; two unaware single-rank jobs would log every step twice
    single = tmp_path / "single"
    check_ok(run_framework([*ARGS, "parallel=single", f"optimizer.lr={lr}"], single))
    assert_parity(run_dir, single)
    job_logs = list((local_sweep / ".submitit").glob(f"*/*_{1}_log.err"))
    assert len(job_logs) == len(LRS)   # a second task (rank 1) ran in each job


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_sbatch_script_for_two_nodes_of_two_tasks(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = tmp_path / "job.sh"
    _fake(bin_dir, "srun", "exit 1")
    _fake(bin_dir, "sbatch", f'cp "$1" {script}; echo "sbatch: error: not a real cluster" >&2; exit 1')
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run_framework(["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "launcher.nproc_per_node=2",
                   "hydra.launcher.partition=gpu", "parallel=fsdp", "optimizer.lr=1e-4,3e-4",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}"], env=env)
    text = script.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --partition=gpu", "#SBATCH --signal=USR2@120", "#SBATCH --job-name=framework"):
        assert line in text.splitlines(), f"{line!r} missing from:\n{text}"
    command = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(command) == 1 and command[0].endswith(f"-m submitit.core._submit {tmp_path / 'sweep'}/.submitit/%j")
