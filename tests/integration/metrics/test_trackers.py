"""Experiment trackers (logging.trackers): a real MLflow tracking server started for the session, a W&B offline run
read back with wandb's own reader, a tracker unreachable at start (exit 2 in one line, or a warning) and one
that fails mid-run (one warning; training and metrics.jsonl go on)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from framework import exit_codes
from framework.config.schema import LoggingConfig
from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.metrics import trackers as trackers_module
from framework.metrics.logger import MetricsLogger
from framework.metrics.trackers import run_ids
from framework.metrics.trackers.base import Tracker, flat_params
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, REPO, check_ok, read_metrics, run_framework

KEYS = ("loss", "lr", "grad_norm", "tokens_per_sec", "mfu", "memory_gb", "step_time")


def closed_port_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"     # nothing listens there once it is closed


def _without(args, *keys):
    return [a for a in args if not a.startswith(keys)]


# ---- MLflow, against the session's server -----------------------------------------------------------------

STEPS = 12
PREEMPTED = [*_without(FAST, "trainer.max_steps", "checkpoint.enabled", "logging.trackers"), f"trainer.max_steps={STEPS}",
             "checkpoint.enabled=true", "checkpoint.resume=auto", "parallel=single", "logging.trackers=[mlflow]",
             "logging.experiment=preempted"]


def _signalled_after(run_dir: Path, steps: int, args: list[str], env: dict) -> subprocess.CompletedProcess:
    """The job, sent SIGTERM once it logged `steps` steps (as a cluster preempts it)."""
    cmd = [sys.executable, "-m", "framework", *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        metrics = run_dir / "metrics.jsonl"
        while proc.poll() is None and time.monotonic() < deadline and \
                (not metrics.exists() or len(metrics.read_text().splitlines()) < steps):
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_a_preempted_and_resumed_job_is_one_mlflow_run_with_every_record(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient
    run_dir = tmp_path / "run"
    env = {"MLFLOW_TRACKING_URI": mlflow_server}
    first = _signalled_after(run_dir, 3, PREEMPTED, env)
    assert first.returncode == exit_codes.REQUEUE, first.stderr[-3000:]
    check_ok(run_framework(PREEMPTED, run_dir, env=env))

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("preempted").experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.run_id == run_ids.recorded(str(run_dir))["mlflow"]
    assert (run.info.status, run.info.run_name) == ("FINISHED", "run")
    config = OmegaConf.load(run_dir / "config.yaml")
    assert run.data.params == {key: str(value) for key, value in flat_params(config).items()}
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for key in KEYS:
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(r["step"], r[key]) for r in records], key
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert run.data.tags["summary.checkpoint"] == str(checkpoints[-1])
    assert run.data.tags["summary.export_command"].startswith(f"python -m framework.export {checkpoints[-1]} ")
    assert float(run.data.tags["summary.loss"]) == records[-1]["loss"]


def test_an_unreachable_tracking_server_is_one_line_and_exit_2(tmp_path):
    uri = closed_port_uri()
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, "logging.trackers=[mlflow]", f"logging.mlflow_tracking_uri={uri}"], run_dir, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: logging.trackers: mlflow: cannot reach the tracking server at {uri} ("), proc.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())
    # a job a rule refuses hears it from the rule: the probe, which may wait on the network, comes after the rules
    proc = run_framework([*FAST, "logging.trackers=[mlflow]", f"logging.mlflow_tracking_uri={uri}",
                          "trainer.max_steps=0"], tmp_path / "refused", timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: trainer.max_steps"), proc.stderr


# ---- W&B offline, read back with wandb's own reader -------------------------------------------------------

def wandb_records(path: Path) -> list:
    """Every record of a run's .wandb transaction log, through wandb's own datastore."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore
    store = datastore.DataStore()
    store.open_for_scan(str(path))
    records = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        records.append(record)
    return records


def test_a_wandb_offline_run_beside_an_unreachable_one_with_warn(tmp_path):
    run_dir = tmp_path / "run"
    uri = closed_port_uri()
    proc = run_framework([*FAST, "logging.trackers=[wandb,mlflow]", "logging.tracker_errors=warn",
                          f"logging.mlflow_tracking_uri={uri}", "logging.experiment=offline"], run_dir,
                         env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    check_ok(proc)
    assert f"warning: logging.trackers: mlflow: cannot reach the tracking server at {uri}" in proc.stderr
    run_id = run_ids.recorded(str(run_dir))["wandb"]
    [log] = (run_dir / "wandb").glob(f"offline-run-*/run-{run_id}.wandb")
    records = wandb_records(log)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name) == (run_id, "offline", "run")
    config = {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}
    assert config == flat_params(OmegaConf.load(run_dir / "config.yaml"))
    assert config["logging.trackers"] == '["wandb"]'      # the warning dropped mlflow
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            history[row["_step"]] = row
    jsonl = read_metrics(run_dir)
    assert sorted(history) == [r["step"] for r in jsonl]
    for r in jsonl:
        assert {k: history[r["step"]][k] for k in KEYS} == {k: r[k] for k in KEYS}


# ---- a tracker that fails mid-run, and the configuration rules --------------------------------------------

class Recording(Tracker):
    name = "recording"
    seen: list = []

    def start(self, cfg, run_dir, run_id):
        return None

    def log(self, step, metrics, texts):
        Recording.seen.append(step)

    def close(self, finished):
        Recording.seen.append(("closed", finished))


class FailsAtStep3(Recording):
    name = "flaky"

    def log(self, step, metrics, texts):
        if step >= 3:
            raise ConnectionError("the server went away")


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(trackers_module.TRACKERS, "recording", "tests.integration.metrics.test_trackers:Recording")
    monkeypatch.setitem(trackers_module.TRACKERS, "flaky", "tests.integration.metrics.test_trackers:FailsAtStep3")
    Recording.seen = []
    logging = OmegaConf.structured(LoggingConfig(trackers=["flaky", "recording"], tracker_errors="fail"))
    cfg = OmegaConf.create({"logging": logging, "trainer": {"progress_bar": False}})
    logger = MetricsLogger(cfg, str(tmp_path), enabled=True, total_steps=6)
    for step in range(1, 7):
        logger.log({"step": step, "loss": 1.0 / step})
    logger.close(finished=True)
    assert Recording.seen == [1, 2, 3, 4, 5, 6, ("closed", True)]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: logging.trackers: flaky failed (log) (ConnectionError: the server went away); "
                        "training goes on without it, metrics.jsonl keeps every record"]


@pytest.fixture(scope="module")
def composer(compose_config):
    return compose_config


@pytest.mark.parametrize("args,expected", [
    (["logging.trackers=[neptune]"], "logging.trackers: 'neptune' is not a tracker; use any of tensorboard, mlflow, wandb"),
    (["logging.trackers=[tensorboard,tensorboard]"], "logging.trackers: names a tracker twice"),
    (["logging.trackers=[mlflow]"], "logging.mlflow_tracking_uri: logging.trackers has mlflow but no tracking server"),
])
def test_tracker_choices_are_checked_before_work(composer, monkeypatch, args, expected):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = composer([*FAST, *args])
    with pytest.raises(ConfigError) as err:
        derive_and_validate(cfg, 1, strategy_class(cfg.parallel.name))
    assert expected in str(err.value)


def test_the_removed_tensorboard_switch_gets_a_one_line_hint(monkeypatch, capsys):
    from framework import __main__ as entry
    monkeypatch.setattr(sys, "argv", ["framework", "logging.tensorboard=false"])
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    assert exit_.value.code == exit_codes.USAGE
    assert capsys.readouterr().err.splitlines() == [
        "error: logging.tensorboard: replaced by logging.trackers: logging.trackers=[] writes no TensorBoard events, "
        "'logging.trackers=[tensorboard,mlflow]' adds MLflow"]
