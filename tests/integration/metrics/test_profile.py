"""Where time goes: a profiler trace of chosen steps on every rank that Chrome-trace tooling reads,
per-step data and step times in metrics.jsonl, and the background batch prefetch that keeps batches
(and so losses) identical."""
import json
import time

from framework.data.prefetch import BatchPrefetcher
from tests.harness.helpers import FAST, SAVE_LAST, check_ok, read_metrics, run_framework
from tests.harness.parity import assert_parity


def test_profiled_steps_leave_a_trace_per_rank_and_change_nothing(tmp_path, reference_run):
    run_dir = tmp_path / "ddp"
    check_ok(run_framework([*FAST, SAVE_LAST, "parallel=ddp", "trainer.profile.steps=[2,3]"], run_dir))
    assert_parity(run_dir, reference_run())
    for rank in (0, 1):
        trace = json.loads((run_dir / "profile" / f"rank_{rank}.pt.trace.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"ProfilerStep#2", "ProfilerStep#3"} <= names
        assert "ProfilerStep#1" not in names and "ProfilerStep#4" not in names
        assert any(str(n).startswith("aten::") for n in names)         # the ops inside the steps
    records = read_metrics(run_dir)
    assert all(0 <= r["data_time"] <= r["step_time"] for r in records)


def test_prefetch_turns_on_when_data_is_slow_and_keeps_the_order():
    made = []

    def make(step):
        made.append(step)
        time.sleep(0.01)
        return [step, step * step]

    prefetch = BatchPrefetcher(make)
    got = [prefetch.get(0)]
    prefetch.observe(data_time=0.001, step_time=1.0)     # fast data: stays off
    assert not prefetch.enabled
    got.append(prefetch.get(1))
    prefetch.observe(data_time=0.2, step_time=1.0)       # > 5% of the step: the next batch is made ahead
    assert prefetch.enabled
    got += [prefetch.get(step) for step in range(2, 6)]
    prefetch.close()
    assert got == [[s, s * s] for s in range(6)]
    assert made[:6] == [0, 1, 2, 3, 4, 5]               # each batch made once, in order
