"""Real servers the tests start on free local ports and tear down after: an S3 server (moto's server mode) and a
Ray cluster (`ray start --head`). conftest.py makes each a session fixture, shared by every test that needs it."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness.helpers import REPO

RAY_STARTUP_S = 180


def refused(cfg, run_dir: Path) -> list[str]:
    """What `python -m framework` says when it refuses the job of a composed config (conftest's compose_config), run
    in this process (launch.run): it must exit 2 having written nothing; returns its lines on stderr."""
    import contextlib
    import io

    from framework.launch import admission
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            admission.run(cfg, str(run_dir))
        except SystemExit as e:
            assert e.code == 2, err.getvalue()
        else:
            raise AssertionError("not refused")
    assert not run_dir.exists(), f"the refused job wrote {run_dir}"
    return err.getvalue().strip().splitlines()


def free_port() -> int:
    """A port nothing listens on now (another process may take it before the caller binds it)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3_server():
    """moto's S3 server in a thread of this process; returns (server, the environment that points clients at it)."""
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    return server, env


def forget_s3_file_systems() -> None:
    """Drop the S3 file systems fsspec cached in this process: it returns the same instance for the same URL
    whatever the environment says now, with the credentials and endpoint it was made under (the class is the one
    registered for s3://, the framework's own subclass, whose cache is its own)."""
    import fsspec
    try:
        fsspec.get_filesystem_class("s3").clear_instance_cache()
    except ImportError:
        pass


def make_bucket(env: dict, name: str) -> str:
    """The bucket `name` on the test's S3 server (made once; later calls find it there)."""
    import boto3
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return f"s3://{name}"


#: the client side of a test's Ray cluster: no auth token (Ray would otherwise write one into ~/.ray)
RAY_CLIENT_ENV = {"RAY_AUTH_MODE": "disabled"}


class RayCluster:
    """`ray start --head --block` in a session of its own, with a temp dir of its own (short: Ray's socket paths
    must fit 107 bytes). Its processes (and so every Ray worker) see this checkout on PYTHONPATH and the S3
    server's endpoint, as a real cluster's nodes have the framework installed and reach their bucket. `.address` is
    its GCS (host:port), `.client_address` its Ray Client server (ray://host:port, on a free port, not Ray's 10001)."""

    def __init__(self, extra_env: dict, reports_file: Path):
        self.reports = reports_file
        self.temp_dir = tempfile.mkdtemp(prefix="fwray", dir="/tmp")
        self.log = Path(self.temp_dir) / "head.log"
        env = {**os.environ, **extra_env, **RAY_CLIENT_ENV, "PYTHONPATH": str(REPO),
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",      # no 30 s drain when the tests end
               # Ray's controller takes one report per poll: a test's steps are milliseconds apart
               "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
               "FRAMEWORK_TEST_RAY_REPORTS": str(reports_file)}
        client_port = free_port()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "ray"), "start", "--head", "--port=0", "--num-cpus=4",
                 f"--ray-client-server-port={client_port}", "--include-dashboard=false", "--disable-usage-stats",
                 f"--temp-dir={self.temp_dir}", "--block"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.temp_dir, start_new_session=True)
        deadline = time.monotonic() + RAY_STARTUP_S
        while not (found := re.search(r"ray start --address='([^']+)'", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ray start failed:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.address = found.group(1)
        self.client_address = f"ray://{self.address.rpartition(':')[0]}:{client_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)      # whatever of its session is left
        except ProcessLookupError:
            pass
        self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
