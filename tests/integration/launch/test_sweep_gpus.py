"""Sweep points that run at once on one GPU node (hydra/launcher=joblib, n_jobs > 1) each see their own
slice of the visible GPUs, or the sweep is refused with one line (GPUs stubbed: counts and env dicts)."""
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.launch import sweep_gpus
from tests.harness.helpers import FAST, REPO

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def joblib(n_jobs):
    return OmegaConf.create({"_target_": JOBLIB, "n_jobs": n_jobs})


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    monkeypatch.setattr(sweep_gpus, "_held", None)


def test_two_concurrent_points_on_8_gpus_get_disjoint_halves(tmp_path):
    env = {}
    assert sweep_gpus.share_gpus_among_points(joblib(2), str(tmp_path), None, env, 8) == "0,1,2,3"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # a second pool worker (its own process, so its own lock) takes the other half
    code = ("import os, sys; from omegaconf import OmegaConf; from framework.launch import sweep_gpus as s; "
            f"print(s.share_gpus_among_points(OmegaConf.create({{'_target_': {JOBLIB!r}, 'n_jobs': 2}}), "
            f"{str(tmp_path)!r}, None, {{}}, 8))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "4,5,6,7", other.stderr


def test_a_pool_workers_later_points_keep_its_slice(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "2,3,5,7"}      # the job's own visible GPUs are what gets shared
    first = sweep_gpus.share_gpus_among_points(joblib(2), str(tmp_path), 1, env, 4)
    assert first == "2"
    assert sweep_gpus.share_gpus_among_points(joblib(2), str(tmp_path), 1, env, 1) == "2"


def test_a_concurrency_the_gpus_cannot_hold_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"hydra.launcher.n_jobs: 3 sweep points at once x 4 GPUs each need 12 "
                                          r"GPUs but 8 are visible; set hydra.launcher.n_jobs to at most 2"):
        sweep_gpus.share_gpus_among_points(joblib(3), str(tmp_path), 4, {}, 8)
    with pytest.raises(ConfigError, match="9 sweep points at once x 1 GPU each need 9 GPUs but 8 are visible"):
        sweep_gpus.share_gpus_among_points(joblib(9), str(tmp_path), None, {}, 8)


def test_points_that_do_not_share_a_machines_gpus_are_left_alone(tmp_path):
    env = {}
    assert sweep_gpus.share_gpus_among_points(joblib(1), str(tmp_path), None, env, 8) is None
    assert sweep_gpus.share_gpus_among_points(OmegaConf.create({"_target_": "x.BasicLauncher"}), str(tmp_path),
                                              None, env, 8) is None
    assert sweep_gpus.share_gpus_among_points(joblib(2), str(tmp_path), None, env, 0) is None   # CPU
    assert env == {}


def test_a_joblib_sweep_on_a_node_of_8_gpus_that_cannot_hold_its_points_exits_2(tmp_path):
    """Through `python -m framework -m`: the refusal comes before any point starts work (8 GPUs stubbed in
    every process through a sitecustomize)."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.is_available = lambda: True\ntorch.cuda.device_count = lambda: 8\n")
    env = {**os.environ, "PYTHONPATH": f"{stub}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "framework", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=3",
                           *FAST, "parallel=ddp", "launcher.nproc_per_node=4", "seed=0,1,2",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: hydra.launcher.n_jobs: 3 sweep points at once x 4 GPUs each need 12 GPUs but 8 are visible" \
        in proc.stderr


LOCAL = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"


def submitit_task(job: str, task: int, node_gpus: str) -> dict:
    """A task's env as submitit's local executor starts it: CUDA_VISIBLE_DEVICES overwritten ('' without
    gpus_per_node), the machine's GPUs as the sweep's own process recorded them."""
    return {"SUBMITIT_LOCAL_JOB_ID": job, "SUBMITIT_LOCAL_LOCALID": str(task), "SUBMITIT_LOCAL_NTASKS": "2",
            "CUDA_VISIBLE_DEVICES": "", sweep_gpus.NODE_GPUS: node_gpus}


def test_the_sweeps_own_process_records_the_machines_gpus_before_submitit_hides_them():
    env = {"CUDA_VISIBLE_DEVICES": "1,3,5,7"}
    sweep_gpus.remember_node_gpus(env, 4)
    assert env[sweep_gpus.NODE_GPUS] == "1,3,5,7"
    env = {}
    sweep_gpus.remember_node_gpus(env, 4)
    assert env[sweep_gpus.NODE_GPUS] == "0,1,2,3"


def _point_slices(sweep_dir, job: str, tasks: int, node_gpus: str, nproc: int, started: list) -> list[str]:
    """Every task of one point, each its own process as submitit starts them (task 0 lives on a while, holding
    its slot, as it would while the point trains); the processes go into `started`."""
    code = ("import os, sys, time; from omegaconf import OmegaConf; from framework.launch import sweep_gpus as s; "
            "env = dict(os.environ); "
            f"print(s.share_gpus_among_local_jobs(OmegaConf.create({{'_target_': {LOCAL!r}}}), {str(sweep_dir)!r}, "
            f"{nproc}, env), env['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(float(sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, "3" if task == 0 else "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, **submitit_task(job, task, node_gpus)}) for task in range(tasks)]
    started += procs
    return [p.stdout.readline().strip() or p.communicate()[1].strip().splitlines()[-1] for p in procs]


@pytest.fixture
def started():
    procs = []
    yield procs
    for p in procs:
        p.communicate(timeout=60)


def test_each_local_sweep_point_sees_its_own_slice_on_every_task(tmp_path, started):
    """Was: every point's tasks saw CUDA_VISIBLE_DEVICES='' (no GPU), or all the same '0,1'."""
    first = _point_slices(tmp_path, "1001", 2, "0,1,2,3", 2, started)
    second = _point_slices(tmp_path, "1002", 2, "0,1,2,3", 2, started)
    assert first == ["0,1 0,1", "0,1 0,1"] and second == ["2,3 2,3", "2,3 2,3"]


def test_more_local_sweep_points_at_once_than_the_gpus_hold_are_refused_on_every_task(tmp_path, monkeypatch, started):
    env = submitit_task("2001", 0, "0,1,2,3")
    assert sweep_gpus.share_gpus_among_local_jobs(OmegaConf.create({"_target_": LOCAL}), str(tmp_path), 4, env) \
        == "0,1,2,3"      # this test process is the first point's task 0, holding the only slot
    monkeypatch.setattr(sweep_gpus, "_held", None)
    refused = _point_slices(tmp_path, "2002", 2, "0,1,2,3", 4, started)
    assert all("hydra/launcher=local starts a batch's sweep points at once; 4 GPUs hold 1 of "
               "launcher.nproc_per_node=4 each" in line for line in refused), refused


def test_a_local_sweep_on_a_machine_without_gpus_is_left_alone(tmp_path):
    env = submitit_task("3001", 0, "")
    assert sweep_gpus.share_gpus_among_local_jobs(OmegaConf.create({"_target_": LOCAL}), str(tmp_path), 2, env) is None
    assert env["CUDA_VISIBLE_DEVICES"] == ""
