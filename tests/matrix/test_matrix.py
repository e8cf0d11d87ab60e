"""Every pair of options the config admits trains with parity, or is refused before launch in one line.

The options are read from the registries and tests/matrix/crossed.py (tests/matrix/axes.py); a covering set of
tiny jobs holds every pair of their values (tests/matrix/cover.py). Each job runs, with the single-process run of its
model and precision, in one multirun; each is held to tests/harness/parity.py against that run (loss and grad norm per
step, every parameter at the end), and jobs that hold every value at least once resume from their step-2
checkpoint and must replay step 3 exactly. A new option or value enters with no edit here: a pair it cannot
serve must be refused by the framework. The summary is printed at the end of the session."""
import pytest

from framework.data.ramp import BatchSizes
from tests.matrix import report
from tests.matrix.cover import all_pairs, names
from tests.matrix.docs import PAGE, README, START, readme_with
from tests.matrix.execute import RESUME_STEP, execute, finish, start
from tests.matrix.oracle import BASE
from tests.matrix.plan import checked_plan, oracle_for, stored_plan
from tests.conftest import summarize
from tests.harness.parity import assert_parity


#: its ~100 runs (58 jobs, 33 references, 12 resumes) take ~4 minutes alone, 5-6 beside the rest of the suite:
#: pytest-xdist starts it among the first modules (tests/conftest.py)
RUNS_LONGEST = True
SKIPPED = "--matrix-plan-only: the plan is checked, its jobs are not trained"


@pytest.fixture(autouse=True)
def _summary_to_the_session_report(request):
    yield
    if report.LINES:
        summarize(request.node, "combination matrix", report.LINES)
        report.LINES.clear()


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    oracle = oracle_for(str(tmp_path_factory.mktemp("matrix_scratch")))
    yield oracle
    oracle.close()


@pytest.fixture(scope="module")
def head_start(oracle, tmp_path_factory, request):
    """The stored plan's sweep, started before the plan is checked (which takes ~20 s of Hydra compositions
    and the framework's checks): the plan a green run checks is the stored one (the docs test holds them
    equal), so its jobs need not wait for the check. None when nothing is trained or a stored job is refused."""
    stored = stored_plan(oracle)
    if request.config.getoption("--matrix-plan-only") or stored is None or \
            any(oracle.verdict(job) is not None for job in stored.jobs):
        yield None
        return
    started = start(stored, oracle, tmp_path_factory.mktemp("matrix"))
    yield started
    started.sweep.stop()                  # a no-op once it has finished; a sweep no test waited for goes


@pytest.fixture(scope="module")
def planned(oracle, head_start, request):
    plan, seconds = checked_plan(oracle)
    if request.config.getoption("--matrix-plan-only"):
        report.LINES.extend(report.summary(plan, seconds))
    return plan, oracle, seconds


@pytest.fixture(scope="module")
def executed(planned, head_start, tmp_path_factory, request):
    if request.config.getoption("--matrix-plan-only"):
        pytest.skip(SKIPPED)
    plan, oracle, _ = planned
    if head_start is not None and head_start.plan.jobs == plan.jobs:
        done = finish(head_start)
    else:                                 # the stored plan is stale (and the docs test fails): train this one
        if head_start is not None:
            head_start.sweep.stop()
        done = execute(plan, oracle, tmp_path_factory.mktemp("matrix"))
    report.LINES.extend(report.summary(plan, done.seconds))
    return done


def test_every_value_trains_in_some_job(planned):
    plan, _, _ = planned
    assert not plan.never, f"values no job admits: {plan.never}"


def test_every_pair_is_covered_or_refused(planned):
    plan, _, _ = planned
    left = set(all_pairs(plan.axes)) - plan.covered() - set(plan.refused)
    assert not left, f"{len(left)} pairs neither run nor refused, e.g. {sorted(left)[:3]}"


def test_every_refusal_is_the_frameworks_one_line_naming_the_pair(planned):
    plan, _, _ = planned
    bad = []
    for (a, b), (reason, job) in plan.refused.items():
        if reason.startswith("too large"):
            continue
        if not reason.startswith("error: ") or "\n" in reason or not (names(reason, a[0]) or names(reason, b[0])):
            bad.append(f"{a} + {b}: {reason}")
    assert not bad, "\n".join(bad[:20])


def test_the_matrix_runs_within_its_world_cap_for_almost_every_pair(planned):
    plan, _, _ = planned
    beyond = [p for p, (r, _) in plan.refused.items() if r.startswith("too large")]
    assert len(beyond) <= 0.01 * plan.pairs, beyond


def test_each_crossed_batch_ramp_grows_after_the_resume_point_within_a_jobs_steps(planned):
    """Else the ramp's value would train one constant batch: no job would change its batch mid-run, nor resume
    across the change."""
    plan, _, _ = planned
    base = dict(o.split("=", 1) for o in BASE)
    steps, final = int(base["trainer.max_steps"]), int(base["trainer.global_batch_size"])
    resumed_at = RESUME_STEP          # the resumed run's first step, 0-based
    ramps = [v for a in plan.axes if a.key == "trainer.rampup_batch_size" for v in a.values if v is not None]
    assert ramps
    for ramp in ramps:
        sizes = [BatchSizes(final, ramp).size(step) for step in range(steps)]
        grows_in_the_resumed_steps = any(sizes[i] != sizes[i - 1] for i in range(resumed_at, steps))
        assert sizes[-1] == final and grows_in_the_resumed_steps, f"{ramp}: steps of {sizes} sequences"


def test_every_job_trains_with_parity_against_its_single_process_run(planned, executed):
    plan, _, _ = planned
    assert not executed.failures, "\n".join(executed.failures)
    failed = []
    for job, run, reference in zip(plan.jobs, executed.runs, executed.references):
        try:
            assert_parity(run, reference)
        except AssertionError as e:
            failed.append(f"{job}: {e}")
    assert not failed, "\n".join(failed)


def test_chosen_jobs_resume_exactly_from_their_step_2_checkpoint(planned, executed):
    plan, _, _ = planned
    assert executed.resumed and not executed.failures, executed.failures
    resumed_values = {item for i in executed.resumed for item in plan.jobs[i].items()}
    assert resumed_values == {item for job in plan.jobs for item in job.items()}
    failed = []
    for i, resumed in executed.resumed.items():
        try:
            assert_parity(resumed, executed.runs[i])
        except AssertionError as e:
            failed.append(f"{plan.jobs[i]}: {e}")
    assert not failed, "\n".join(failed)


def test_the_docs_show_this_plan(planned):
    plan, _, _ = planned
    hint = "regenerate with `python -m tests.matrix --write`"
    assert PAGE.exists() and PAGE.read_text() == report.pairs_page(plan), f"{PAGE} is stale; {hint}"
    text = README.read_text()
    assert START in text and readme_with(plan, text) == text, f"README's combinations table is stale; {hint}"
