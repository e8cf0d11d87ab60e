"""MLflow through its own client: the run lives on the tracking server of logging.mlflow_tracking_uri
(else MLFLOW_TRACKING_URI), in the experiment logging.experiment, named logging.run_name.

Parameters are immutable in MLflow: a resumed attempt adds the keys the run lacks and leaves the others
as the first attempt logged them. A step logged again after a crash (one the checkpoint did not hold) gets
a second value at that step in the metric's history."""
from __future__ import annotations

import contextlib
import math
import os
import re
import time

from framework.metrics.trackers.base import Tracker, TrackerError, flat_params
from framework.redact import redacted, without_userinfo

# A server that is down must not hold the run: the client's own default retries for minutes. Each request waits
# logging.tracker_timeout_s (MLflow takes whole seconds); those from the background thread are tried again twice
# (MLFLOW_HTTP_REQUEST_MAX_RETRIES, where the user set none), the probe's are not.
RETRIES = "2"
BATCH = 100                  # MLflow's limit on params or tags a call (and well under its 1000 metrics)
KEY = re.compile(r"[^\w\-. /:]")


def tracking_uri(cfg) -> str | None:
    return cfg.logging.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")


def request_timeout(cfg) -> str:
    """MLFLOW_HTTP_REQUEST_TIMEOUT for logging.tracker_timeout_s (an integer there)."""
    return str(max(1, math.ceil(cfg.logging.tracker_timeout_s)))
def client_uri(uri: str | None) -> tuple[str | None, dict[str, str]]:
    """(the URI the client is given, the environment that carries its credentials): a user:password@ in the
    URI goes to the client as MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, which it sends as basic
    auth, so that neither the URI it keeps nor its errors hold the password."""
    if uri is None:
        return None, {}
    plain, user, password = without_userinfo(uri)
    env = {"MLFLOW_TRACKING_USERNAME": user} if user else {}
    if password is not None:
        env["MLFLOW_TRACKING_PASSWORD"] = password
    return plain, env


@contextlib.contextmanager
def _environ(**values: str):
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _chunks(items: list, n: int = BATCH):
    for i in range(0, len(items), n):
        yield items[i:i + n]


class MlflowTracker(Tracker):
    name = "mlflow"
    package = "mlflow"

    @classmethod
    def probe(cls, cfg) -> None:
        from mlflow.tracking import MlflowClient
        uri = tracking_uri(cfg)
        plain, credentials = client_uri(uri)
        with _environ(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=request_timeout(cfg), **credentials):
            try:
                MlflowClient(plain).search_experiments(max_results=1)
            except Exception as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise TrackerError(f"mlflow: cannot reach the tracking server at {redacted(uri)} "
                                   f"({redacted(reason)[:200]}); start it, "
                                   f"or fix logging.mlflow_tracking_uri / MLFLOW_TRACKING_URI") from None

    def start(self, cfg, run_dir: str, run_id: str | None) -> str:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", RETRIES)
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = request_timeout(cfg)
        plain, credentials = client_uri(tracking_uri(cfg))
        self._credentials = contextlib.ExitStack()      # this process logs: its client sends them, until close
        self._credentials.enter_context(_environ(**credentials))
        self.client = client = MlflowClient(plain)
        logged = {}
        if run_id is not None:
            try:
                logged = client.get_run(run_id).data.params
                client.update_run(run_id, status="RUNNING")
            except MlflowException as e:
                raise TrackerError(f"mlflow: the run {run_id} this run dir records is gone from the server "
                                   f"({e.message[:200]}); remove trackers.json from the run dir to start a new one")
        else:
            run_id = client.create_run(self._experiment(cfg.logging.experiment), run_name=cfg.logging.run_name,
                                       tags={"framework.run_dir": os.path.abspath(run_dir)}).info.run_id
        self.run_id = run_id
        params = [Param(key, str(value)[:MAX_PARAM_VAL_LENGTH]) for key, value in flat_params(cfg).items()
                  if key not in logged]
        for chunk in _chunks(params):
            client.log_batch(run_id, params=chunk)
        return run_id

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:      # another job created it meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def log(self, step: int, metrics: dict[str, float], texts: dict[str, str]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        entries = [Metric(KEY.sub("_", key), value, now, step) for key, value in metrics.items()]
        for chunk in _chunks(entries, 1000):
            self.client.log_batch(self.run_id, metrics=chunk)
        for key, value in texts.items():
            self.client.log_text(self.run_id, value, f"{KEY.sub('_', key)}/step_{step:08d}.txt")

    def log_summary(self, summary: dict) -> None:
        from mlflow.entities import RunTag
        tags = [RunTag(f"summary.{key}", str(value)) for key, value in summary.items()]
        for chunk in _chunks(tags):
            self.client.log_batch(self.run_id, tags=chunk)

    def close(self, finished: bool) -> None:
        try:
            self.client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")
        finally:
            self._credentials.close()
