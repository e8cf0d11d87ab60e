"""A stage's jobs run in processes of their own (a job's GPU memory and compiled kernels go with it), each
stopped, with every process it started, when the stage's time is up."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from framework.metrics.trace_steps import trace_step_times

REPO = Path(__file__).resolve().parents[2]
TAIL_LINES = 20


@dataclass
class Finished:
    code: int | None            # None: stopped at its time limit
    stdout: str
    stderr: str
    wall_s: float
    limit_s: float
    records: list[dict] = field(default_factory=list)    # a framework job's metrics.jsonl
    trace: dict | None = None                           # its profiler trace's step times (trace_steps)

    @property
    def ok(self) -> bool:
        return self.code == 0

    def failure(self) -> str:
        """One line: how it ended."""
        if self.code is None:
            return f"stopped at its limit of {self.limit_s:.0f} s"
        lines = self.tail()
        return f"exit {self.code}: {lines[-1] if lines else '(no output)'}"[:300]

    def tail(self) -> list[str]:
        """Its last lines of output, stderr after stdout (where a traceback or `error:` line ends up)."""
        lines = [line for line in (self.stdout + "\n" + self.stderr).splitlines() if line.strip()]
        return lines[-TAIL_LINES:]


def run_process(cmd: list[str], limit_s: float, on_line: Callable[[str], None] | None = None) -> Finished:
    """`cmd` in the repository, in a process group of its own, killed whole after `limit_s` seconds;
    `on_line` sees each line of its stdout as it comes."""
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        out: list[str] = []
        err: list[str] = []

        def read_stdout():
            for line in proc.stdout:
                out.append(line)
                if on_line is not None:
                    on_line(line)
        readers = [threading.Thread(target=read_stdout, daemon=True),
                   threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            code = proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        for reader in readers:
            reader.join(timeout=10)
    return Finished(code, "".join(out), "".join(err), time.monotonic() - start, limit_s)


def run_framework(args: list[str], run_dir: Path, limit_s: float) -> Finished:
    """`python -m framework ARGS hydra.run.dir=RUN_DIR`, and what it wrote there."""
    done = run_process([sys.executable, "-m", "framework", *args, f"hydra.run.dir={run_dir}"], limit_s)
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        done.records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trace = run_dir / "profile" / "rank_0.pt.trace.json"
    if done.ok and trace.exists():
        done.trace = trace_step_times(str(trace))
    return done


def commit() -> str:
    """The commit these files are at: git's, else the stamp benchmarks/gather_gpu_wheels.sh left in .whl/
    (the GPU machine gets the working tree without .git), else GPU_SESSION_COMMIT."""
    if os.environ.get("GPU_SESSION_COMMIT"):
        return os.environ["GPU_SESSION_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    stamp = REPO / ".whl" / "COMMIT"
    return stamp.read_text().strip() if stamp.exists() else "unknown"


def device_description() -> dict:
    """The GPU (from nvidia-smi: no CUDA context is opened in the session's own process), torch and commit."""
    from importlib.metadata import version
    gpu = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            gpu = smi.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"gpu": gpu, "torch": version("torch"), "commit": commit(), "host_cpus": os.cpu_count()}
