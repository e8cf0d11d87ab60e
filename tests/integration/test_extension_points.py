"""docs/design/extending.md's promise: a new strategy, model family, data source, objective, metric and launcher
engine are each one file plus one registry line. tests/fixtures/toy_extension holds a toy of each (one file
each) and registers them (one line each) before `python -m framework`; one tiny job trains with all of them,
and a second one, whose objective is scaled by 1 instead of 2, shows the objective is what trains."""
import pytest
import yaml

from tests.fixtures.toy_extension.model import ToyLM
from tests.harness.helpers import check_ok, read_metrics, run_framework

TOY = ["parallel=single", "parallel.name=toy", "model=custom",
       "model._target_=tests.fixtures.toy_extension.model.ToyLM", "data=synthetic", "data.source=toy",
       "data.num_tokens=4096", "launcher.engine=toy", "data.seq_len=32", "trainer.max_steps=2",
       "trainer.global_batch_size=8", "trainer.micro_batch_size=4", "trainer.log_every=1", "trainer.eval_every=0",
       "trainer.progress_bar=false", "logging.trackers=[]", "checkpoint.enabled=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for scale in ("2", "1"):
        run_dir = tmp_path_factory.mktemp(f"toy_scale{scale}")
        proc = run_framework(TOY, run_dir, module="tests.fixtures.toy_extension", env={"TOY_OBJECTIVE_SCALE": scale})
        check_ok(proc)
        out[scale] = (run_dir, proc)
    return out


def test_a_job_trains_with_a_toy_of_every_extension_point(runs):
    run_dir, proc = runs["2"]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (cfg["parallel"]["name"], cfg["data"]["source"], cfg["launcher"]["engine"]) == ("toy", "toy", "toy")
    assert "toy engine: the worker runs in the launching process" in proc.stdout
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    parameters = sum(p.numel() for p in ToyLM().parameters())
    for record in records:
        assert record["toy_parameters"] == parameters      # the registered metric, read on the toy strategy's model
        assert record["toy_spec"] == 1.0                     # the model was served by the toy family's spec


def test_the_registered_objective_is_what_trains(runs):
    """Step 1 is the same model on the same batch: loss and gradients are exactly twice the unscaled ones."""
    scaled, plain = read_metrics(runs["2"][0])[0], read_metrics(runs["1"][0])[0]
    assert scaled["loss"] == pytest.approx(2 * plain["loss"], rel=1e-6)
    assert scaled["grad_norm"] == pytest.approx(2 * plain["grad_norm"], rel=1e-6)
