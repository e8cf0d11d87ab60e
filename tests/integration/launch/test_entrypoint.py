"""The entrypoint as a user runs it: the embedded default, sweeps, the run dir's contents."""
import math
import os
import sys

import yaml

from tests.harness.helpers import FAST, REPO, check_ok, read_metrics, run_framework, run_in_own_session

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True

METRIC_KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_sec", "mfu", "memory_gb", "memory_reserved_gb"}


def test_default_job_learns(tmp_path):
    """`python -m framework` with nothing else: byte-level loss starts near ln 256 and falls clearly."""
    run_dir = tmp_path / "default"
    check_ok(run_framework([], run_dir, timeout=1200))
    records = read_metrics(run_dir)
    assert METRIC_KEYS <= records[0].keys()
    first, last = records[0]["loss"], records[-1]["loss"]
    assert abs(first - math.log(256)) < 0.3
    assert last < 0.6 * first
    assert records[-1]["step"] == 200 and "val_loss" in records[-1]
    assert records[-1]["val_loss"] < 0.7 * first
    assert all(math.isfinite(r["grad_norm"]) and r["tokens_per_sec"] > 0 and 0 < r["mfu"] for r in records)
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["parallel"]["name"] == "single" and resolved["model"]["dim"] > 0
    assert (run_dir / ".hydra" / "overrides.yaml").exists()
    assert any((run_dir / "tensorboard").iterdir())


def test_multirun_gives_one_run_dir_per_point(tmp_path):
    sweep = tmp_path / "sweep"
    args = [a for a in FAST if not a.startswith(("optimizer.lr", "trainer.max_steps"))]
    proc = run_framework(["-m", *args, "parallel=ddp", "optimizer.lr=1e-3,2e-3", "trainer.max_steps=3",
                          f"hydra.sweep.dir={sweep}"])
    check_ok(proc)
    points = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in points] == ["0", "1"]
    lrs = []
    for point in points:
        records = read_metrics(point)
        assert [r["step"] for r in records] == [1, 2, 3]
        lrs.append(yaml.safe_load((point / "config.yaml").read_text())["optimizer"]["lr"])
    assert lrs == [1e-3, 2e-3]


def test_metrics_and_config_are_written_once_by_rank_zero(trained_run):
    run_dir = trained_run("parallel=ddp")     # FAST, 2 workers (the session's shared job)
    assert read_metrics(run_dir)[-1]["world_size"] == 2
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(1, 9))     # one line per step, not one per rank


def test_worker_failure_makes_the_parent_fail(tmp_path):
    """A worker that raises at run time fails the whole job with a runtime exit code (not 0, not 2)."""
    proc = run_framework([*FAST, "parallel=ddp", "model=custom",
                          "model._target_=tests.fixtures.models.ExplodingModel"], tmp_path / "fail")
    assert proc.returncode not in (0, 2), proc.stderr[-2000:]
    assert "worker rank 1 failed" in proc.stderr and "boom" in proc.stderr


def test_torchrun_ranks_agree_on_one_timestamped_run_dir(tmp_path):
    """Every torchrun rank composes the config itself; without hydra.run.dir they must still share rank 0's
    run dir (a per-rank `${now:...}` would split the job over several dirs)."""
    proc = run_in_own_session([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "framework", *FAST, "parallel=ddp"],
                          cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    check_ok(proc)
    run_dirs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]   # outputs/<date>/<time>
    assert len(run_dirs) == 1, run_dirs
    assert [r["step"] for r in read_metrics(run_dirs[0])] == list(range(1, 9))


def test_help_lists_only_what_a_user_picks():
    proc = run_in_own_session([sys.executable, "-m", "framework", "--help"], cwd=REPO, timeout=60)
    check_ok(proc)
    assert "schema" not in proc.stdout
    for line in ("parallel: 3d, auto, ddp, deepspeed, fsdp, single*", "zero: none*, stage1, stage2, stage3",
                 "+recipe: cpu_small_ddp"):
        assert line in proc.stdout, proc.stdout


def test_run_ends_with_a_summary_and_the_commands_to_go_on(tmp_path):
    run_dir = tmp_path / "summary"
    args = [a for a in FAST if not a.startswith(("trainer.max_steps", "checkpoint.enabled", "trainer.eval_every"))]
    proc = run_framework([*args, "trainer.max_steps=2", "trainer.eval_every=2"], run_dir)
    check_ok(proc)
    ckpt = run_dir / "checkpoints" / "step_00000002"
    out = proc.stdout
    assert "done: 2 steps" in out and "loss " in out and "val_loss " in out and "tokens/s" in out and "MFU" in out
    assert f"run dir     {run_dir}" in out and f"checkpoint  {ckpt}" in out
    assert f"checkpoint.resume={ckpt} trainer.max_steps=<more than 2>" in out and "model=tiny" in out
    assert f"python -m framework.export {ckpt} {run_dir / 'hf'}" in out
