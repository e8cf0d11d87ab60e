"""logging.tracker_timeout_s bounds what a tracker's server can cost a job: its check before launch, its start on
rank 0 and the drain at the end each wait at most that long, and no step ever waits for it. Against trackers that
block in this process, and against an MLflow server that never answers one call (a listener that never speaks; a
fake tracking server that hangs on the run's experiment, or on the run's end): MLflow's client used to try each
call three times with 30 s timeouts, ~95 s before the job went on or exited."""
import threading
import time

import pytest
from omegaconf import OmegaConf

from framework.config.schema import LoggingConfig
from framework.metrics import trackers as trackers_module
from framework.metrics.logger import MetricsLogger
from framework.metrics.trackers import Trackers
from framework.metrics.trackers.base import Tracker, TrackerError
from tests.harness.helpers import FAST, read_metrics, run_framework
from tests.harness.listeners import HangingMlflow, Listener

TIMEOUT_S = 0.5
#: a job's own time around the wait: its interpreter's exit on a busy two-core machine
SLACK_S = 10
UNBLOCK = threading.Event()


@pytest.fixture(autouse=True)
def unblocked_at_the_end():
    """The blocked trackers' threads end with the test (they are daemons: they would not hold the process)."""
    UNBLOCK.clear()
    yield
    UNBLOCK.set()


class Blocking(Tracker):
    """Blocks in `blocks` until the test ends; `.seen`: the steps it got."""
    name, blocks, seen = "blocking", (), []

    def start(self, cfg, run_dir, run_id):
        if "start" in self.blocks:
            UNBLOCK.wait()
        return None

    def log(self, step, metrics, texts):
        Blocking.seen.append(step)
        if "log" in self.blocks:
            UNBLOCK.wait()

    def close(self, finished):
        if "close" in self.blocks:
            UNBLOCK.wait()


def cfg_with(blocks: tuple[str, ...], errors: str = "fail", monkeypatch=None):
    monkeypatch.setitem(trackers_module.TRACKERS, "blocking",
                        "tests.integration.metrics.test_tracker_timeouts:Blocking")
    monkeypatch.setattr(Blocking, "blocks", blocks)
    monkeypatch.setattr(Blocking, "seen", [])
    logging = OmegaConf.structured(LoggingConfig(trackers=["blocking"], tracker_errors=errors,
                                                 tracker_timeout_s=TIMEOUT_S))
    return OmegaConf.create({"logging": logging, "trainer": {"progress_bar": False}})


def test_a_start_that_never_returns_is_given_up_after_the_timeout(monkeypatch, tmp_path, capsys):
    began = time.monotonic()
    with pytest.raises(TrackerError) as refusal:
        Trackers(cfg_with(("start",), "fail", monkeypatch), str(tmp_path))
    assert str(refusal.value) == ("logging.trackers: blocking did not start (TimeoutError: no answer within "
                                  f"logging.tracker_timeout_s={TIMEOUT_S:g} s)")
    assert Trackers(cfg_with(("start",), "warn", monkeypatch), str(tmp_path)).live == []
    assert capsys.readouterr().err.startswith("warning: logging.trackers: blocking did not start (TimeoutError: ")
    assert time.monotonic() - began < 2 * TIMEOUT_S + 2


def test_steps_never_wait_for_a_blocked_tracker_and_the_end_waits_the_timeout(monkeypatch, tmp_path, capsys):
    logger = MetricsLogger(cfg_with(("log", "close"), "fail", monkeypatch), str(tmp_path), enabled=True,
                           total_steps=5)
    began = time.monotonic()
    for step in range(1, 6):
        logger.log({"step": step, "loss": 1.0 / step})
    logged = time.monotonic()
    logger.close(finished=True)
    assert Blocking.seen == [1]        # still in its first record: every other step went on without it
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert logged - began < TIMEOUT_S and TIMEOUT_S <= time.monotonic() - logged < TIMEOUT_S + 2
    assert capsys.readouterr().err.splitlines() == [
        f"warning: logging.trackers: blocking still busy after logging.tracker_timeout_s={TIMEOUT_S:g} s; the last "
        f"records may be missing there (metrics.jsonl has them)"]


# ---- MLflow's own client, against servers that do not answer ---------------------------------------------------

JOB_TIMEOUT_S = 2
MLFLOW = [*FAST, "parallel=single", "trainer.max_steps=2", "logging.trackers=[mlflow]",
          f"logging.tracker_timeout_s={JOB_TIMEOUT_S}"]


def test_a_tracking_server_that_never_answers_the_check_is_one_line_and_exit_2(tmp_path):
    silent = Listener("hold")
    try:
        proc = run_framework([*MLFLOW, f"logging.mlflow_tracking_uri=http://{silent.address}"], tmp_path / "run",
                             timeout=120)
        ended = time.monotonic()
    finally:
        silent.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: logging.trackers: mlflow: cannot reach the tracking server at "
                               f"http://{silent.address} (")
    assert len(silent.arrivals) == 1 and ended - silent.arrivals[0] < JOB_TIMEOUT_S + SLACK_S


@pytest.mark.parametrize("hang,code,said", [
    ("experiments/get-by-name", 1, "error: logging.trackers: mlflow did not start (TimeoutError: no answer within "
                                   f"logging.tracker_timeout_s={JOB_TIMEOUT_S} s)"),
    ("runs/update", 0, f"warning: logging.trackers: mlflow still busy after logging.tracker_timeout_s={JOB_TIMEOUT_S} "
                       f"s; the last records may be missing there (metrics.jsonl has them)"),
], ids=["at its start", "at the run's end"])
def test_a_tracking_server_that_stops_answering_holds_the_job_at_most_the_timeout(hang, code, said, tmp_path):
    """It answers the check; then the run's experiment (rank 0's start) or the run's end (the drain at the job's end)
    never gets an answer: the job goes on or ends in one line within the timeout."""
    server = HangingMlflow(hang=(hang,))
    try:
        proc = run_framework([*MLFLOW, f"logging.mlflow_tracking_uri={server.uri}"], tmp_path / "run", timeout=120)
        ended = time.monotonic()
    finally:
        server.close()
    assert proc.returncode == code, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith(("error", "warning"))] == [said]
    assert server.hung and ended - server.hung[0] < JOB_TIMEOUT_S + SLACK_S      # (the abandoned call may retry)
