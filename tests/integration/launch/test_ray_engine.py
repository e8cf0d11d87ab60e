"""launcher.engine=ray against a real Ray cluster this module starts (tests/harness/servers.py): the same jobs as under
our own launcher give the same losses (ddp x2; fsdp x2 through docs/how-to/ray.md's command for an existing cluster),
the metrics reach Ray's controller, keep_best keeps the right checkpoints in a bucket that also holds Ray's own
files, and a bad address is refused in one line before any work (the address check shakes hands with the real head
here; with what is not Ray in test_ray_address). A Ray worker killed mid-run: test_docs_ray."""
import json

import pytest

from framework.checkpoint.retention import Saved, kept_steps
from tests.harness.helpers import FAST, check_ok, losses, max_rel_diff, read_metrics, run_framework
from tests.harness.planted_secrets import (bucket_objects, files_under, leaks, planted_env, redacted_uri, wandb_offline,
                                           with_password)
from tests.harness.servers import RAY_CLIENT_ENV, RayCluster, make_bucket, refused
from tests.docs.test_docs_ray import EXISTING, shell

EXACT = 1e-6
RAY = ["launcher.engine=ray"]
REPORTS = "launcher.ray.callbacks=[tests.fixtures.ray_reports.RecordReports]"


@pytest.fixture(scope="module")
def ray_cluster(s3_env, tmp_path_factory):
    """One Ray cluster for this module's jobs (Ray takes seconds to start), up only while they run; its nodes
    reach the S3 server and log to W&B offline (under `.home`). `.address` is its head, `.reports` the file
    tests.fixtures.ray_reports writes."""
    home = tmp_path_factory.mktemp("ray_home")
    cluster = RayCluster({**s3_env, **wandb_offline(home)}, tmp_path_factory.mktemp("ray") / "reports.jsonl")
    cluster.home = home
    yield cluster
    cluster.stop()


def ray_job(ray_cluster, s3_env, run_dir, *args, env=None, base=FAST):
    return run_framework([*base, *RAY, f"launcher.ray.address={ray_cluster.address}", *args], run_dir, timeout=600,
                         env={**s3_env, **RAY_CLIENT_ENV, **(env or {})})


@pytest.fixture(scope="module")
def ddp_on_ray(ray_cluster, s3_env, mlflow_server, tmp_path_factory):
    """ddp x2 on Ray, evaluating and saving every 2 steps into a bucket, keeping the newest and the 2 best by
    val_loss, every record also passed to a Ray callback; logging to TensorBoard, W&B (offline) and MLflow through
    a URL with a password, with secrets in its environment (tests/harness/planted_secrets.py)."""
    bucket = make_bucket(s3_env, "ray-ddp")
    run_dir = tmp_path_factory.mktemp("ray_ddp")
    home = tmp_path_factory.mktemp("ray_ddp_home")
    proc = ray_job(ray_cluster, s3_env, run_dir, "parallel=ddp", "checkpoint.enabled=true", "checkpoint.interval=2",
                   "trainer.eval_every=2", "checkpoint.keep_last=1", "checkpoint.keep_best=2",
                   f"checkpoint.dir={bucket}/ckpt", REPORTS, "logging.trackers=[tensorboard,mlflow,wandb]",
                   "logging.experiment=ray-secrets", f"logging.mlflow_tracking_uri={with_password(mlflow_server)}",
                   env=planted_env(s3_env, home), base=[a for a in FAST if not a.startswith("logging.trackers")])
    check_ok(proc)
    return run_dir, f"{bucket}/ckpt", home, proc


def test_ddp_under_ray_gives_our_launchers_losses(ddp_on_ray, trained_run):
    run_dir = ddp_on_ray[0]
    assert max_rel_diff(losses(trained_run("parallel=ddp")), losses(run_dir)) <= EXACT


def test_every_metrics_record_reaches_rays_controller(ddp_on_ray, ray_cluster):
    run_dir = ddp_on_ray[0]
    seen = [json.loads(line)["metrics"] for line in ray_cluster.reports.read_text().splitlines()
            if json.loads(line)["run_dir"] == str(run_dir)]
    logged = read_metrics(run_dir)
    assert [(r["step"], r["loss"]) for r in seen] == [(r["step"], r["loss"]) for r in logged]
    assert [r["val_loss"] for r in seen if "val_loss" in r] == [r["val_loss"] for r in logged if "val_loss" in r]


def test_keep_best_keeps_the_newest_and_the_best_by_val_loss_and_ray_stores_beside_them(ddp_on_ray, s3_here):
    from framework import storage
    run_dir, root = ddp_on_ray[:2]
    scored = [Saved(r["step"], r["val_loss"]) for r in read_metrics(run_dir) if "val_loss" in r]
    expected = {f"step_{s:08d}" for s in kept_steps(scored, keep_last=1, keep_best=2)}
    best = sorted(scored, key=lambda s: s.score)[:2]
    assert len(scored) == 4 and expected == {f"step_{s.step:08d}" for s in best} | {"step_00000008"}
    names = storage.listdir(root)
    assert {n for n in names if n.startswith("step_")} == expected
    assert all(storage.isfile(storage.join(root, n, "meta.json")) for n in expected)
    assert [n for n in names if n.startswith("ray-")], f"Ray's own files are not under {root}: {names}"


def test_no_file_log_bucket_or_tracker_store_of_a_ray_job_holds_a_secret(ddp_on_ray, ray_cluster, s3_env,
                                                                         mlflow_server, mlflow_root):
    """Ray's own logs (its session under the cluster's temp dir: driver, controller and worker logs) and the
    files Ray Train keeps beside the checkpoints too; MLflow still got the run, its parameters redacted."""
    from mlflow.tracking import MlflowClient
    run_dir, _, home, proc = ddp_on_ray
    written = {**files_under(run_dir, home, ray_cluster.home, mlflow_root, ray_cluster.temp_dir),
               **bucket_objects(s3_env, "ray-ddp"),
               "stdout": proc.stdout, "stderr": proc.stderr}
    assert any("/logs/" in p and "worker" in p for p in written) and any("/wandb/" in p for p in written)
    assert any(p.startswith("s3://ray-ddp/ckpt/ray-") for p in written)
    assert leaks(written) == []
    client = MlflowClient(mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("ray-secrets").experiment_id])
    assert run.data.params["logging.mlflow_tracking_uri"] == redacted_uri(mlflow_server)
    assert len(client.get_metric_history(run.info.run_id, "loss")) == len(read_metrics(run_dir))


def test_on_an_existing_cluster_the_job_gives_our_launchers_losses(ray_cluster, s3_env, tmp_path, trained_run):
    """docs/how-to/ray.md's command for an existing cluster (fsdp x2), the tests' FAST settings appended."""
    make_bucket(s3_env, "my-bucket")
    proc = shell(EXISTING, tmp_path, {"RAY_HEAD": ray_cluster.address, **s3_env}, *FAST, "hydra.run.dir=run")
    check_ok(proc)
    assert max_rel_diff(losses(trained_run("parallel=fsdp", "zero=stage3")), losses(tmp_path / "run")) <= EXACT


def test_a_bad_ray_address_is_one_line_and_exit_2_before_any_work(tmp_path, compose_config):
    assert refused(compose_config([*FAST, *RAY, "launcher.ray.address=127.0.0.1:1"]), tmp_path / "run") == [
        "error: launcher.ray.address: 127.0.0.1:1: no Ray cluster answers there (Connection refused)"]


def test_the_address_check_shakes_hands_with_a_real_head(ray_cluster):
    """The head's GCS as host:port and its Ray Client server as ray://host:port pass; each given in the other's form
    is refused, naming the form it takes. Listeners that are not Ray: tests/integration/launch/test_ray_address.py."""
    from framework.errors import ConfigError
    from framework.launch.ray import _reachable
    gcs, client = ray_cluster.address, ray_cluster.client_address
    _reachable(gcs)
    _reachable(client)
    swapped = {f"ray://{gcs}": "not a Ray Client server; a head's GCS is host:port, without ray://",
               client[len("ray://"):]: "not a Ray GCS; a Ray Client server is ray://host:port"}
    for address, hint in swapped.items():
        with pytest.raises(ConfigError) as refused:
            _reachable(address)
        assert str(refused.value) == (f"launcher.ray.address: {address}: no Ray cluster answers there (a gRPC server "
                                      f"answers, but {hint})")


@pytest.mark.parametrize("address,said", [("nosuchhost.invalid:6379", "nosuchhost.invalid:6379: no such host"),
                                          ("just-a-name", "'just-a-name' is not host:port (or ray://host:port)")])
def test_an_address_that_cannot_be_a_ray_head_is_refused_naming_it(address, said):
    from framework.errors import ConfigError
    from framework.launch.ray import _host_port, _reachable
    assert _host_port("ray://head:10001") == ("head", 10001) and _host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)
    with pytest.raises(ConfigError) as refused:
        _reachable(address)
    assert str(refused.value).startswith(f"launcher.ray.address: {said}")
