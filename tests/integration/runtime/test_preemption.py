"""Preemption: a signal mid-run -> the step finishes, a checkpoint is saved, exit code REQUEUE;
the re-run with checkpoint.resume=auto continues the uninterrupted curve exactly. The signal comes the
ways clusters deliver it: to the launcher only (Kubernetes), to the workers only, to the whole process
group at once (SLURM, `timeout`), and repeated while the workers save."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framework import exit_codes
from tests.harness.helpers import FAST, REPO, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

STEPS = 40
ARGS = [*(a for a in FAST if not a.startswith(("trainer.max_steps", "checkpoint.enabled"))),
        f"trainer.max_steps={STEPS}", "checkpoint.enabled=true", "parallel=ddp", "launcher.nproc_per_node=2"]


def _logged_steps(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _workers(launcher: int) -> list[int]:
    """The training processes: children of the launcher's fork server (the launcher's other child is
    multiprocessing's resource tracker, which has none)."""
    return [worker for child in _children(launcher) for worker in _children(child)]


def deliver(proc: subprocess.Popen, sig: int, pattern: str) -> None:
    if pattern == "launcher":
        proc.send_signal(sig)
    elif pattern == "workers":
        for worker in _workers(proc.pid):
            os.kill(worker, sig)
    else:                                   # "group", "repeated": every process of the job, as SLURM does
        for _ in range(4 if pattern == "repeated" else 1):
            os.killpg(proc.pid, sig)
            time.sleep(0.3)


def run_and_signal(run_dir: Path, sig: int, after_steps: int, extra=(), pattern="launcher"
                   ) -> subprocess.CompletedProcess:
    """Start the job in its own process group, deliver `sig` once `after_steps` steps are logged."""
    overridden = {e.split("=")[0] for e in extra}
    cmd = [sys.executable, "-m", "framework", *(a for a in ARGS if a.split("=")[0] not in overridden), *extra,
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while _logged_steps(run_dir) < after_steps and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        deliver(proc, sig, pattern)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _saved(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir() if (p / "meta.json").is_file()) if root.exists() else []


@pytest.fixture(scope="module")
def preempted_and_resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    reference = root / "reference"
    check_ok(run_framework(ARGS, reference))
    run_dir = root / "run"
    stopped = run_and_signal(run_dir, signal.SIGTERM, after_steps=3, pattern="group")
    saved = _saved(run_dir)
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
    assert assert_parity(run_dir, reference)["kind"] == "fp32"


LAYOUTS = {"ddp": ["parallel=ddp"], "fsdp": ["parallel=fsdp", "zero=stage3"],
           "deepspeed": ["parallel=deepspeed", "zero=stage2"]}
CASES = [("ddp", "launcher"), ("ddp", "workers"), ("ddp", "repeated"),
         ("fsdp", "group"), ("fsdp", "workers"), ("deepspeed", "group"), ("deepspeed", "repeated")]


@pytest.mark.parametrize("strategy,pattern", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_every_delivery_saves_one_checkpoint_of_the_last_step(tmp_path, strategy, pattern):
    """(ddp, group) is the module fixture's job, which also resumes."""
    sig = {"launcher": signal.SIGUSR2, "workers": signal.SIGUSR1}.get(pattern, signal.SIGTERM)
    run_dir = tmp_path / "run"
    stopped = run_and_signal(run_dir, sig, after_steps=3, extra=LAYOUTS[strategy], pattern=pattern)
    logged = _logged_steps(run_dir)
    assert stopped.returncode == exit_codes.REQUEUE, stopped.stderr[-4000:]
    assert 3 <= logged < STEPS, "the signal came after the run ended: the test proves nothing"
    assert _saved(run_dir) == [f"step_{logged:08d}"]
    assert stopped.stderr.strip().splitlines()[-1].startswith("stopped by "), stopped.stderr[-2000:]
    assert "after a checkpoint" in stopped.stderr.strip().splitlines()[-1]


def test_without_a_checkpoint_the_launcher_says_so_and_does_not_ask_for_a_requeue(tmp_path):
    run_dir = tmp_path / "run"
    stopped = run_and_signal(run_dir, signal.SIGTERM, after_steps=3, extra=["checkpoint.enabled=false"],
                             pattern="group")
    assert stopped.returncode not in (0, exit_codes.REQUEUE), stopped.stderr[-4000:]
    assert 3 <= _logged_steps(run_dir) < STEPS
    last = stopped.stderr.strip().splitlines()[-1]
    assert last == "error: stopped by SIGTERM without a checkpoint of the last step (checkpoint.enabled=false)", \
        stopped.stderr[-4000:]
    assert "the checkpoint is saved" not in stopped.stderr


def test_unknown_preempt_signal_is_a_usage_error(tmp_path):
    proc = run_framework([*FAST, "launcher.preempt_signals=[SIGTERM,SIGNOPE]"], tmp_path / "bad")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: launcher.preempt_signals: 'SIGNOPE'")
    assert not (tmp_path / "bad").exists()
