"""The suite's jobs fork from tests/harness/job_server.py; a job run there must be the job a fresh interpreter runs:
the same losses to the bit, the same output, the same exit code and one-line error, its environment its own."""
import os
import re
import subprocess
import time

import pytest

from tests.harness import job_client
from tests.harness.helpers import FAST, read_metrics, run_framework


def _both(monkeypatch, args, run_dirs, env=None):
    served = run_framework(args, run_dirs[0], env=env)
    monkeypatch.setenv(job_client.OFF, "1")
    fresh = run_framework(args, run_dirs[1], env=env)
    return served, fresh


def test_a_served_job_trains_as_a_fresh_interpreter_does(tmp_path, monkeypatch):
    served, fresh = _both(monkeypatch, [*FAST, "parallel=ddp", "trainer.max_steps=3"], [tmp_path / "a", tmp_path / "b"])
    assert served.returncode == fresh.returncode == 0, served.stderr[-3000:] + fresh.stderr[-3000:]
    assert [r["loss"] for r in read_metrics(tmp_path / "a")] == [r["loss"] for r in read_metrics(tmp_path / "b")]
    shape = lambda out, run: [re.sub(r"[\d.,:%]+", "N", line.replace(str(run), "RUN")) for line in out.splitlines()]  # noqa: E731
    assert shape(served.stdout, tmp_path / "a") == shape(fresh.stdout, tmp_path / "b")


def test_a_served_job_fails_as_a_fresh_interpreter_does(tmp_path, monkeypatch):
    served, fresh = _both(monkeypatch, [*FAST, "model.n_layers=0"], [tmp_path / "a", tmp_path / "b"])
    assert served.returncode == fresh.returncode == 2
    assert served.stderr == fresh.stderr and len(served.stderr.strip().splitlines()) == 1


def test_a_served_job_collects_only_what_it_made_and_names_rendezvous_events_from_frames(tmp_path):
    """The server's imports are out of the job's garbage collections (gc.freeze), and its launches name their
    rendezvous events without inspect.stack(): the two test-only shortcuts tests/harness/job_server.py takes."""
    import json
    from pathlib import Path
    proc = job_client.run("tests.fixtures.served_state", [], Path(tmp_path), dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["frozen"] > 100_000 and found["names_events"] == "_method_name", found


def test_a_job_setting_what_torch_reads_at_start_gets_its_own_interpreter():
    assert not job_client.serves({"TORCH_LOGS": "dynamo"})
    assert not job_client.serves({"OMP_NUM_THREADS": "7"})


def test_jobs_after_a_compile_or_a_deepspeed_import_in_this_process_are_still_served(monkeypatch):
    written = job_client.written_by_libraries()
    started = {k: v for k, v in os.environ.items() if k not in written}
    monkeypatch.setitem(job_client._servers, None, {"env": started})
    import importlib
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    importlib.import_module("deepspeed")
    cache_dir()
    assert job_client.serves(dict(os.environ))
    assert not job_client.serves({**os.environ, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"})


def _in_session(session: int) -> set[int]:
    """Live processes of a session: a job and every worker it started (pytest-xdist may run other tests'
    jobs beside this one, each in a session of its own)."""
    ps = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True, check=True).stdout
    return {int(pid) for pid, sid, stat in (line.split()[:3] for line in ps.splitlines())
            if int(sid) == session and not stat.startswith("Z")}


def test_a_job_past_its_timeout_is_killed_with_its_workers(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        # long enough for the job to start on a loaded host (pytest-xdist: 10 s was too short once)
        run_framework([*FAST, "parallel=ddp", "trainer.max_steps=100000"], tmp_path / "run", timeout=30)
    assert (tmp_path / "run" / "metrics.jsonl").exists()        # it trained: the workers were there to kill
    deadline = time.monotonic() + 10     # SIGKILL is delivered at once; a process takes a moment to go
    while _in_session(expired.value.session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _in_session(expired.value.session)
