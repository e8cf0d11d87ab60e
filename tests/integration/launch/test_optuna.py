"""Optuna through Hydra's sweeper: each trial returns trainer.objective; an invalid trial is recorded as
failed and the study goes on; optimization_results.yaml holds the best."""
import re

import pytest
import yaml

from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework

ARGS = [a for a in FAST if not a.startswith(("trainer.micro_batch_size", "trainer.eval_every", "trainer.max_steps"))]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("optuna")
    # micro batch 3 does not divide the global batch of 8: that trial's config is invalid (seed 1 draws it once)
    proc = run_framework(["-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=1",
                          "hydra.sweeper.n_trials=4", "trainer.micro_batch_size=choice(2,3,4)", *ARGS,
                          "trainer.max_steps=4", "trainer.eval_every=4", "trainer.eval_batches=1",
                          f"hydra.sweep.dir={sweep}"], timeout=900)
    return sweep, proc


def test_study_completes_with_the_invalid_trial_failed(study):
    sweep, proc = study
    check_ok(proc)
    drawn = [int(m) for m in re.findall(r"#\d+ : trainer\.micro_batch_size=(\d)", proc.stdout + proc.stderr)]
    assert len(drawn) == 4 and drawn.count(3) == 1
    assert len(re.findall(r"Failed experiment: exit code 2", proc.stdout + proc.stderr)) == 1
    assert "error: trainer.global_batch_size: 8 is not divisible" in proc.stderr
    ran = sorted(p.name for p in sweep.iterdir() if (p / "metrics.jsonl").exists())
    assert len(ran) == 3        # the invalid trial left no run dir behind


def test_results_hold_the_best_trial_and_its_objective(study):
    sweep, _ = study
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    finals = [read_metrics(p)[-1]["val_loss"] for p in sweep.iterdir() if (p / "metrics.jsonl").exists()]
    assert results["best_value"] == pytest.approx(min(finals))   # the default objective: the final val_loss
    assert results["best_params"]["trainer.micro_batch_size"] in (2, 4)


def test_plain_sweep_of_invalid_points_still_exits_2(tmp_path):
    """Points now fail one at a time (so a study can go on); a basic sweep whose points all fail on
    their config remains a usage error."""
    proc = run_framework(["-m", *ARGS, "trainer.micro_batch_size=3,5", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert proc.returncode == 2
    assert proc.stderr.count("error: trainer.global_batch_size:") == 2


def test_a_study_of_val_loss_without_evaluation_is_refused_before_its_first_trial(tmp_path):
    sweep = tmp_path / "s"
    proc = run_framework(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", *ARGS, "trainer.max_steps=2",
                          "trainer.eval_every=0", "optimizer.lr=interval(1e-4,1e-3)", f"hydra.sweep.dir={sweep}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: trainer.eval_every:") and "trainer.objective=loss" in errors[0]
    assert "Traceback" not in proc.stderr
    assert not list(sweep.rglob("metrics.jsonl")) and not [p for p in sweep.iterdir() if p.is_dir()]
