"""eval.tasks under the multi-process layouts gives the scores parallel=single gives at the same step: every rank
runs lm-eval on the same requests, each forward goes through the strategy (sharded parameters gathered, vocabulary
sharded logits, data-parallel rows split), and rank 0's scores are recorded. The weights after one step differ
between layouts by what summing in another order gives (1e-5 in the losses), so accuracy is the same and the
log-likelihood metrics agree to 1e-4."""
import pytest

from tests.harness.helpers import DEEPSPEED_Z3, FAST, check_ok, read_metrics, run_framework

RUNS_LONGEST = True
#: eval.limit=2: the smallest that has both ranks of a data-parallel pair score multiple-choice requests (FAST's
#: forward is 8 rows, a document 4 requests) besides a rolling document's windows
SCORED = ["trainer.max_steps=1", "eval.tasks=[fw_pyfacts,fw_pytext]", "eval.limit=2", "eval.every=1"]
LAYOUTS = {
    "fsdp2": ["parallel=fsdp", "zero=stage3"],
    "deepspeed_zero3": list(DEEPSPEED_Z3),
    "3d_tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"],
}
LOGLIKELIHOOD = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def _scores(run_dir) -> dict[str, float]:
    (record,) = [r for r in read_metrics(run_dir) if r["step"] == 1]
    return {k: v for k, v in record.items() if k.startswith("eval/")}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    check_ok(run_framework([*FAST, *SCORED, "parallel=single"], run_dir))
    return _scores(run_dir)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_scores_as_single_does(layout, single, tmp_path):
    run_dir = tmp_path / layout
    proc = run_framework([*FAST, *SCORED, *LAYOUTS[layout]], run_dir)
    check_ok(proc)
    assert read_metrics(run_dir)[0]["world_size"] == 2
    ours = _scores(run_dir)
    assert set(ours) == set(single) and len(single) == 5
    for key, value in single.items():
        if key.rsplit("/", 1)[1] in LOGLIKELIHOOD:
            assert ours[key] == pytest.approx(value, rel=1e-4), key
        else:
            assert ours[key] == value, key
