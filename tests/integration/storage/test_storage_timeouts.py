"""checkpoint.storage_timeout_s bounds every object-store request of a job, in the launcher and in each worker: an S3
endpoint that accepts connections and never answers fails the job after storage.timeouts.ATTEMPTS attempts of about
the timeout each (s3fs's own loop around botocore's used to make 25 of 15 s: 412 s and more before the job's one
line). Against a listener that never says a word (the launcher's check) and a proxy in front of the tests' S3 server
that never answers the checkpoint's uploads (the workers' save)."""
import time

import fsspec
import fsspec.config
import pytest

from framework.storage import s3 as bounded_s3
from framework.storage.timeouts import ATTEMPTS, set_timeout
from tests.harness.helpers import FAST, run_framework
from tests.harness.listeners import HangingProxy, Listener
from tests.harness.servers import make_bucket

TIMEOUT_S = 1
#: botocore's standard retry mode sleeps a jittered 2^attempt s at most between attempts (1 s, then 2 s)
BACKOFF_S = 3
#: what a job adds around the waits: its interpreter's exit, the workers' teardown on a busy two-core machine
SLACK_S = 15


def test_the_timeout_reaches_every_s3_file_system_and_keeps_the_users_fsspec_settings(monkeypatch):
    monkeypatch.setitem(fsspec.config.conf, "s3", {"config_kwargs": {"max_pool_connections": 4}, "anon": True})
    set_timeout(7)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    assert type(fs) is bounded_s3.S3FileSystem and fs.retries == 1 and fs.anon
    assert fs.config_kwargs == {"max_pool_connections": 4, "connect_timeout": 7, "read_timeout": 7,
                                "retries": {"mode": "standard", "total_max_attempts": ATTEMPTS}}


def test_an_endpoint_that_never_answers_is_refused_in_one_line_after_its_attempts(s3_env, tmp_path):
    """The launcher's check writes one object: each attempt waits the timeout, then the job says so and exits 2."""
    silent = Listener("hold")
    try:
        proc = run_framework([*FAST, "parallel=single", "checkpoint.enabled=true", "checkpoint.dir=s3://bucket/run",
                              f"checkpoint.storage_timeout_s={TIMEOUT_S}"], tmp_path / "run", timeout=120,
                             env={**s3_env, "AWS_ENDPOINT_URL": f"http://{silent.address}"})
        ended = time.monotonic()
    finally:
        silent.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: checkpoint.dir: s3://bucket/run: cannot write there (ReadTimeoutError: ")
    assert len(silent.arrivals) == ATTEMPTS
    assert ended - silent.arrivals[0] < ATTEMPTS * TIMEOUT_S + BACKOFF_S + SLACK_S


@pytest.mark.parametrize("layout", [["parallel=ddp", "launcher.nproc_per_node=2"]], ids=["ddp x2"])
def test_the_workers_save_to_an_endpoint_that_stops_answering_fails_within_the_same_bound(layout, s3_env, tmp_path):
    """The launcher's check goes through; the spawned workers' uploads of the checkpoint never get an answer. Each
    worker sets the timeout from the config it was handed (a fresh process: none of the launcher's settings)."""
    bucket = make_bucket(s3_env, "stops-answering")
    proxy = HangingProxy(s3_env["AWS_ENDPOINT_URL"],
                         lambda method, path: method == "PUT" and ".framework-write-check-" not in path)
    try:
        proc = run_framework([*FAST, *layout, "trainer.max_steps=2", "checkpoint.enabled=true",
                              f"checkpoint.dir={bucket}/run", f"checkpoint.storage_timeout_s={TIMEOUT_S}"],
                             tmp_path / "run", timeout=300, env={**s3_env, "AWS_ENDPOINT_URL": proxy.uri})
        ended = time.monotonic()
    finally:
        proxy.close()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: worker rank ")
    assert "ReadTimeoutError: Read timeout on endpoint URL" in proc.stderr.strip().splitlines()[-1]
    tries = {path: sum(p == path for _, p in proxy.hung) for _, path in proxy.hung}
    assert max(tries.values()) == ATTEMPTS, tries
    assert ended - proxy.hung[0][0] < ATTEMPTS * TIMEOUT_S + BACKOFF_S + SLACK_S
