"""Sweep points that run at once on one GPU node (hydra/launcher=joblib, n_jobs > 1) each see their own
slice of the visible GPUs, or the sweep is refused with one line (GPUs stubbed: counts and env dicts)."""
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from framework import sweep_gpus
from framework.errors import ConfigError
from tests.helpers import FAST, REPO

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
    code = ("import os, sys; from omegaconf import OmegaConf; from framework import sweep_gpus as s; "
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
