"""The tests catch the bugs users fear: each bug of tests/fixtures/planted/planted_bugs.py, planted in every
process of the named tests' jobs (a sitecustomize on PYTHONPATH), must make at least one of them fail.
The named tests run in a pytest session of their own per bug; the clean runs they compare against are
trained here, without the bug, and handed over (conftest.REUSE). The terminal summary lists, per bug, the
tests that caught it and how."""
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from tests import conftest
from tests.fixtures.planted.planted_bugs import BUGS
from tests.harness.helpers import REPO, run_in_own_session

PLANTED = REPO / "tests" / "fixtures" / "planted"
RESUME = "tests/integration/checkpoint/test_checkpoint.py::test_resume_is_exact[single]"

#: bug -> the tests that must catch it (the small, fast ones)
CAUGHT_BY = {
    "ddp-sum": ["tests/integration/strategies/test_parity_ddp.py::test_ddp_two_workers_matches_single"],
    "fsdp-sum": ["tests/integration/strategies/test_fsdp.py::test_fsdp_matches_single[zero2_x2-args0]"],
    "parallel3d-sum":
        ["tests/integration/strategies/test_parallel3d.py::test_layout_matches_single[dp2_tp2_zero_none]"],
    "deepspeed-sum": ["tests/integration/strategies/test_deepspeed.py::test_fp32_loss_parity_with_single[stage1]"],
    "tp-allreduce-dropped": ["tests/integration/strategies/test_parallel3d.py::test_layout_matches_single[tp2]"],
    # the sampler's own test, in the pytest process (test_parity_ddp catches it too: a grad norm off by 0.33)
    "rank-reads-another-shard":
        ["tests/unit/data/test_data.py::test_global_batch_is_identical_whatever_the_dp_degree[2]"],
    "resume-off-by-one": [RESUME],
    "optimizer-state-not-restored": [RESUME],
    "rng-state-not-restored": ["tests/integration/models/test_hf_models.py::test_resume_with_dropout_is_exact"],
    "checkpoint-complete-early":
        ["tests/integration/checkpoint/test_checkpoint.py::test_kill_during_save_leaves_the_previous_checkpoint_usable"],
}

def test_every_planted_bug_names_the_tests_that_catch_it():
    assert set(CAUGHT_BY) == set(BUGS)


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory, trained_run, reference_run):
    """The clean reference runs the named tests read, trained in this session (the other test files
    share them), listed in a file for the planted sessions."""
    from tests.integration.models.test_hf_models import DROPOUT
    trained_run("parallel=single")
    reference_run("trainer.max_steps=6")
    trained_run(*DROPOUT, base=())
    path = tmp_path_factory.mktemp("planted") / "runs.json"
    path.write_text(json.dumps({" ".join(args): str(run_dir) for args, run_dir in conftest.RUNS.items()}))
    return path


def _test_id(case) -> str:
    return f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"


def _outcomes(junit) -> dict[str, str | None]:
    """test id -> the first line of how its call failed, or None where it passed or its setup failed."""
    out = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        failure = case.find("failure")
        message = (failure.get("message") or "failed").strip().splitlines() if failure is not None else None
        out[_test_id(case)] = message[0][:200] if message else None
    return out


@pytest.mark.parametrize("bug", list(CAUGHT_BY))
def test_planted_bug_fails_a_named_test(tmp_path, clean_runs, bug, request):
    tests = CAUGHT_BY[bug]
    junit = tmp_path / "junit.xml"
    env = {**os.environ, "FRAMEWORK_TEST_PLANT": bug, conftest.REUSE: str(clean_runs),
           "PYTHONPATH": os.pathsep.join(p for p in (str(PLANTED), os.environ.get("PYTHONPATH")) if p)}
    proc = run_in_own_session([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"--basetemp={tmp_path / 'session'}", f"--junitxml={junit}", *tests],
                              cwd=REPO, env=env, timeout=600)
    assert junit.exists(), f"pytest with {bug} planted wrote no report:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    outcomes = _outcomes(junit)
    assert set(tests) <= set(outcomes), f"no such test: {sorted(set(tests) - set(outcomes))}"
    caught = {test: how for test, how in outcomes.items() if how is not None}
    conftest.summarize(request.node, "planted bugs and the tests that caught them",
                       [f"{bug}: " + ("NOT CAUGHT" if not caught else "")] + [f"    {t}: {how}" for t, how in caught.items()])
    assert caught, f"{bug} planted, and every named test passed:\n{proc.stdout[-3000:]}"
