"""The test session's side of tests/harness/job_server.py: start it once, hand it jobs, read what they printed."""
from __future__ import annotations

import atexit
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: set to 1 to run every job as a new interpreter (to compare, or to rule the server out)
OFF = "FRAMEWORK_TEST_NO_JOB_SERVER"
#: environment variables read when torch or Python start (the server started with the session's): a job
#: that sets them differently gets an interpreter of its own
READ_AT_START = ("TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA", "PYTHON", "LD_", "MALLOC")
#: a job whose environment holds this (JSON: variables its server starts with instead of the job's own) is
#: served by a server of its own environment, started once: tests/harness/readme_env.py's jobs (README's install,
#: emulated by a sitecustomize on PYTHONPATH) share one that starts with every extra hidden
SERVER_START = "FRAMEWORK_TEST_SERVER_START"

_servers: dict[tuple, dict] = {}     # the variables read at start (and SERVER_START) -> a running server


@functools.cache
def written_by_libraries() -> dict[str, str]:
    """Variables under READ_AT_START that libraries write into os.environ as they run, with the value they
    write, and that torch reads when it uses them, not when it starts: inductor its cache dir, the first
    time it looks it up; deepspeed's import PYTORCH_NVML_BASED_CUDA_CHECK. Once this process compiled
    anything or imported deepspeed, every later job carried them and got an interpreter of its own (in one
    CI run: ~250 jobs and as many fork servers, each importing torch and the framework again)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    return {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir(), "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def _read_at_start(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(READ_AT_START) and k != "PYTHONUNBUFFERED"}


def _key(env: dict) -> tuple:
    return (env.get(SERVER_START), *sorted(_read_at_start(env).items()))


def serves(env: dict) -> bool:
    if os.environ.get(OFF) == "1":
        return False
    if env.get(SERVER_START):
        return True
    start = _servers.get(None, {}).get("env") or os.environ
    written = written_by_libraries()
    return all(env.get(k) == start.get(k) or (k not in start and env.get(k) == written.get(k))
               for k in {*_read_at_start(env), *_read_at_start(start)})


def address(env: dict | None = None) -> str:
    """The socket of the server for `env` (None: the session's own), the server started first if need be."""
    own = env is not None and bool(env.get(SERVER_START))
    key = _key(env) if own else None
    server = _servers.get(key, {})
    if "address" in server and server["process"].poll() is None:
        return server["address"]
    folder = tempfile.mkdtemp(prefix="jobs-")
    address = os.path.join(folder, "server.sock")
    repo = Path(__file__).resolve().parents[2]
    env = {**(env if own else os.environ), **(json.loads(env[SERVER_START]) if own else {}), "PYTHONUNBUFFERED": "1"}
    log = open(os.path.join(folder, "server.log"), "w")
    process = subprocess.Popen([sys.executable, "-m", "tests.harness.job_server", address], cwd=repo, env=env,
                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(address):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job server did not start: {open(log.name).read()[-3000:]}")
        time.sleep(0.05)
    atexit.register(lambda: process.poll() is None and os.killpg(process.pid, signal.SIGKILL))
    _servers[key] = {"address": address, "process": process, "env": env}
    return address


def run(module: str, args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` in `cwd` with `env`, as subprocess.run would give it back; on timeout the
    job's whole process group is killed and subprocess.TimeoutExpired raised."""
    cmd = [sys.executable, "-m", module, *args]
    with tempfile.TemporaryDirectory(prefix="job-") as folder, socket.socket(socket.AF_UNIX) as conn:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        conn.connect(address(env))
        conn.sendall(json.dumps({"module": module, "argv": [str(a) for a in args], "cwd": str(cwd), "env": env,
                                 "stdout": out, "stderr": err}).encode() + b"\n")
        answers = _Lines(conn)
        pid = answers.next(None)["pid"]
        ended = answers.next(timeout)
        if ended is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            answers.next(None)
            expired = subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err))
            expired.session = pid               # the job's session, which its workers share
            raise expired
        return subprocess.CompletedProcess(cmd, ended["returncode"], _read(out), _read(err))


class _Lines:
    """JSON lines from a socket, each within a timeout (None: however long it takes)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer = conn, b""

    def next(self, timeout: float | None) -> dict | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            chunk = self.conn.recv(65536)
            if not chunk:
                raise RuntimeError("the job server closed the connection before the job ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""
