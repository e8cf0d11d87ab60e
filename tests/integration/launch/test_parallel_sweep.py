"""Sweep points running at the same time on one machine (hydra/launcher=joblib) never collide: each
2-rank point gets its own rendezvous port, run dir, checkpoints and TensorBoard dir, and the losses
of a lone run."""
import pytest

from tests.harness.helpers import FAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

ARGS = [a for a in FAST if not a.startswith(("logging.trackers", "checkpoint.enabled"))]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("joblib")
    check_ok(run_framework(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *ARGS, "parallel=ddp",
                            "launcher.nproc_per_node=2", "logging.trackers=[tensorboard]", "checkpoint.enabled=true",
                            "seed=0,1", f"hydra.sweep.dir={root}"], timeout=600))
    return root


@pytest.mark.parametrize("point", [0, 1])
def test_parallel_points_keep_their_own_files_and_losses(sweep, reference_run, point):
    run_dir = sweep / str(point)
    assert len(losses(run_dir)) == 8
    assert_parity(run_dir, reference_run(f"seed={point}"))
    assert len(list((run_dir / "tensorboard").iterdir())) == 1
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000008"]
