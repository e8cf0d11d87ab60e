"""Preemption: a signal mid-run -> the step finishes, a checkpoint is saved, exit code REQUEUE;
the re-run with checkpoint.resume=auto continues the uninterrupted curve exactly."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framework import exit_codes
from tests.helpers import FAST, REPO, check_ok, losses, max_rel_diff, run_framework

STEPS = 40
ARGS = [*(a for a in FAST if not a.startswith(("trainer.max_steps", "checkpoint.enabled"))),
        f"trainer.max_steps={STEPS}", "checkpoint.enabled=true", "parallel=ddp", "launcher.nproc_per_node=2"]


def _logged_steps(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def run_and_signal(run_dir: Path, sig: int, after_steps: int, extra=()) -> subprocess.CompletedProcess:
    """Start the job, send `sig` to the launching process once `after_steps` steps are logged."""
    cmd = [sys.executable, "-m", "framework", *ARGS, *extra, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _logged_steps(run_dir) < after_steps and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def preempted_and_resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    reference = root / "reference"
    check_ok(run_framework(ARGS, reference))
    run_dir = root / "run"
    stopped = run_and_signal(run_dir, signal.SIGTERM, after_steps=3)
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir()) if (run_dir / "checkpoints").exists() else []
    logged = _logged_steps(run_dir)
    resumed = run_framework([*ARGS, "checkpoint.resume=auto"], run_dir)
    return reference, run_dir, stopped, saved, logged, resumed


def test_sigterm_saves_a_checkpoint_and_exits_requeue(preempted_and_resumed):
    _, run_dir, stopped, saved, logged, _ = preempted_and_resumed
    assert stopped.returncode == exit_codes.REQUEUE, stopped.stderr[-4000:]
    assert 3 <= logged < STEPS, "the signal came after the run ended: the test proves nothing"
    # the checkpoint is of the last step that finished: nothing done is lost
    assert saved == [f"step_{logged:08d}"]
    meta = json.loads((run_dir / "checkpoints" / saved[0] / "meta.json").read_text())
    assert meta["step"] == logged and meta["world_size"] == 2
    assert "preempted" in stopped.stderr


def test_resume_auto_continues_the_uninterrupted_curve(preempted_and_resumed):
    reference, run_dir, _, _, _, resumed = preempted_and_resumed
    check_ok(resumed)
    assert len(losses(run_dir)) == STEPS
    assert max_rel_diff(losses(reference), losses(run_dir)) <= 1e-6


def test_unknown_preempt_signal_is_a_usage_error(tmp_path):
    proc = run_framework([*FAST, "launcher.preempt_signals=[SIGTERM,SIGNOPE]"], tmp_path / "bad")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: launcher.preempt_signals: 'SIGNOPE'")
    assert not (tmp_path / "bad").exists()
