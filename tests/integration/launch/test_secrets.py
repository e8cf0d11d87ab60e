"""Credentials never reach a file, a log or a tracker, and the trackers still get them.

One job with secrets planted (tests/harness/planted_secrets.py: a password in the MLflow URL of its command line,
secrets in its environment): a one-point sweep of ddp x2 under the torch launcher, checkpoints in the tests' S3
bucket, TensorBoard, MLflow against the session's server, W&B offline. Every file it wrote anywhere -- the sweep
dir (Hydra's records, config.yaml, TensorBoard, W&B), W&B's own folders, the bucket, MLflow's store and
artifacts -- and everything it printed is searched for them. The Ray engine's run:
tests/integration/launch/test_ray_engine.py.
"""
import base64
import http.server
import threading

import pytest
import yaml
from omegaconf import OmegaConf

from framework.redact import redacted, without_userinfo
from tests.harness.helpers import FAST, check_ok, run_framework
from tests.harness.planted_secrets import (PASSWORD, SHOWN, USER, bucket_objects, files_under, leaks, planted_env,
                                           redacted_uri, with_password)
from tests.harness.servers import make_bucket, refused
from tests.integration.metrics.test_trackers import closed_port_uri

BUCKET = "secrets"
JOB = [*(a for a in FAST if not a.startswith(("trainer.max_steps", "checkpoint.enabled", "logging.trackers"))),
       "parallel=ddp", "trainer.max_steps=2", "checkpoint.enabled=true", f"checkpoint.dir=s3://{BUCKET}/ckpt",
       "logging.trackers=[tensorboard,mlflow,wandb]", "logging.experiment=secrets"]


@pytest.fixture(scope="module")
def planted_job(tmp_path_factory, s3_env, mlflow_server):
    root = tmp_path_factory.mktemp("secrets")
    env = planted_env(s3_env, root / "home")
    make_bucket(env, BUCKET)
    proc = run_framework(["-m", *JOB, f"logging.mlflow_tracking_uri={with_password(mlflow_server)}",
                          f"hydra.sweep.dir={root / 'sweep'}"], env=env)
    check_ok(proc)
    return root, env, proc


def test_no_file_log_bucket_or_tracker_store_holds_a_secret(planted_job, s3_env, mlflow_root):
    root, env, proc = planted_job
    written = {**files_under(root, mlflow_root), **bucket_objects(env, BUCKET),
               "stdout": proc.stdout, "stderr": proc.stderr}
    assert {"multirun.yaml", "config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.rsplit("/", 1)[-1] for p in written}
    assert any("/wandb/" in p for p in written) and any("/tensorboard/" in p for p in written)
    assert any(p.startswith(f"s3://{BUCKET}/ckpt/step_00000002/") for p in written)
    assert leaks(written) == []


def test_what_is_written_and_printed_shows_the_user_and_hides_the_password(planted_job, mlflow_server):
    root, _, proc = planted_job
    shown = redacted_uri(mlflow_server)
    override = f"logging.mlflow_tracking_uri={shown}".replace(":", "\\:")     # as Hydra records a sweep's
    run_dir = root / "sweep" / "0"
    assert OmegaConf.load(run_dir / "config.yaml").logging.mlflow_tracking_uri == shown
    assert override in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    resume = next(line for line in proc.stdout.splitlines() if "resume:" in line)
    assert override in resume
    assert "#0 : " in proc.stdout and SHOWN.replace(":", "\\:") in proc.stdout     # Hydra's line for the point


def test_mlflow_got_the_run_with_redacted_parameters(planted_job, mlflow_server):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("secrets").experiment_id])
    assert run.data.params["logging.mlflow_tracking_uri"] == redacted_uri(mlflow_server)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An MLflow server's experiment search, answering nothing, keeping each request's Authorization header."""
    seen: list = []

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self._answer()

    def _answer(self):
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"experiments": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_mlflows_client_sends_the_urls_credentials_as_basic_auth(compose_config):
    from framework.metrics.trackers.mlflow_tracker import MlflowTracker
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = with_password(f"http://127.0.0.1:{server.server_address[1]}")
        MlflowTracker.probe(compose_config([*FAST, "logging.trackers=[mlflow]", f"logging.mlflow_tracking_uri={uri}"]))
    finally:
        server.shutdown()
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert _Recorder.seen and all(auth == expected for _, auth in _Recorder.seen), _Recorder.seen


def test_an_unreachable_tracker_is_one_line_without_the_password(tmp_path, compose_config):
    uri = with_password(closed_port_uri())
    [line] = refused(compose_config([*FAST, "logging.trackers=[mlflow]", f"logging.mlflow_tracking_uri={uri}"]),
                     tmp_path / "run")
    assert line.startswith(f"error: logging.trackers: mlflow: cannot reach the tracking server at {redacted(uri)} ")
    assert PASSWORD not in line and SHOWN in line


def test_hydras_own_error_for_a_misspelt_key_shows_no_password(tmp_path):
    """Hydra prints a bad override with its value (`To append to your config use +key=value`)."""
    proc = run_framework([*FAST, f"logging.mlflow_tracking_urii={with_password('http://mlflow.example')}"],
                         tmp_path / "run")
    assert proc.returncode == 2 and "logging.mlflow_tracking_urii" in proc.stderr, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr and SHOWN in proc.stderr


def _pods_env(job: dict) -> list[list[dict]]:
    """The env list of each kind of pod a manifest starts."""
    if job["kind"] == "TrainJob":
        return [job["spec"]["trainer"]["env"]]
    if job["kind"] == "PyTorchJob":
        return [r["template"]["spec"]["containers"][0]["env"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    cluster = job["spec"]["rayClusterSpec"]
    return [g["template"]["spec"]["containers"][0]["env"] for g in [cluster["headGroupSpec"],
                                                                    *cluster["workerGroupSpecs"]]]


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob", "rayjob"])
def test_k8s_puts_the_credentials_in_a_secret_the_pods_read(kind, monkeypatch):
    import jsonschema
    from kubeflow_trainer_api.models.io_k8s_api_core_v1_secret import IoK8sApiCoreV1Secret
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    from tests.integration.k8s.test_k8s import RAYJOB_SCHEMA, SCHEMA
    uri = with_password("http://mlflow.example:5000")
    proc = run_framework(["--kind", kind, "--image", "i", "--nodes", "2", "model=tiny", "parallel=ddp",
                          "logging.trackers=[mlflow]", f"logging.mlflow_tracking_uri={uri}"], module="framework.k8s")
    check_ok(proc)
    secret, config_map, job = yaml.safe_load_all(proc.stdout)
    assert IoK8sApiCoreV1Secret.from_dict(secret).to_dict() == secret
    if kind == "trainjob":
        assert TrainerV1alpha1TrainJob.from_dict(job).to_dict() == job
    else:
        jsonschema.validate(job, SCHEMA if kind == "pytorchjob" else RAYJOB_SCHEMA)
    variable = "FRAMEWORK_SECRET_LOGGING_MLFLOW_TRACKING_URI"
    assert secret["stringData"] == {variable: uri}
    assert proc.stdout.count(PASSWORD) == 1         # the Secret's own value, nowhere else
    reference = {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": variable}}}
    assert all(reference in env for env in _pods_env(job))
    # the pod composes the ConfigMap's config with the Secret's value in its environment: the URL comes back
    monkeypatch.setenv(variable, uri)
    assert OmegaConf.create(config_map["data"]["config.yaml"]).logging.mlflow_tracking_uri == uri


@pytest.mark.parametrize("text,shown", [
    ("http://user:pa55:word@host:5000/path", "http://user:***@host:5000/path"),
    ("uri=https://me:s3cret@mlflow.corp/", "uri=https://me:***@mlflow.corp/"),
    ("two: http://a:b@h1 and s3://c:d@h2/x", "two: http://a:***@h1 and s3://c:***@h2/x"),
    ("http://:token@host", "http://:***@host"),
    ("git clone https://ghp_T0KEN@github.com/o/r.git", "git clone https://***@github.com/o/r.git"),
    ("wss://T0KEN@host/socket and HTTP\\://T0KEN@host", "wss://***@host/socket and HTTP\\://***@host"),
    ("https://host/file?X-Amz-Signature=abc123&part=1", "https://host/file?X-Amz-Signature=***&part=1"),
    ("https://host/api?api_key=k1&token=t2", "https://host/api?api_key=***&token=***"),
    ("ssh://git@host/repo, http://host:8080/x, /a/b:c@d, user@example.com, http://host:8080/a@b", None),
])
def test_redacted_hides_url_passwords_and_query_secrets_only(text, shown):
    assert redacted(text) == (text if shown is None else shown)
    assert redacted({"k": [text, 3]}) == {"k": [redacted(text), 3]}


def test_without_userinfo_gives_the_url_and_the_decoded_credentials():
    assert without_userinfo("http://me:p%40ss@[::1]:5000/x?y=1") == ("http://[::1]:5000/x?y=1", "me", "p@ss")
    assert without_userinfo("http://host:5000") == ("http://host:5000", None, None)
