"""Elastic world size: two torchrun "nodes" (`--nnodes=1:2`, c10d rendezvous, 2 workers each); the node
not hosting the rendezvous store is SIGKILLed mid-run. The survivor re-forms the group at world size 2,
resumes from the last checkpoint with the same global batch (gradient accumulation doubles) and ends
with the losses of an uninterrupted single-process run. And the other way: a node that joins a running
1-node job grows the group to world size 4 with the same guarantee (torchrun started as docs/how-to/multi-node.md says,
with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).

torchrun runs through tests/fixtures/torchrun_short_exit_barrier.py: after the run, torch's agent would
otherwise wait out a 300 s exit barrier for the lost node (torchrun has no flag for it)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.helpers import FAST, REPO, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

STEPS, KILL_AT = 30, 12
ARGS = [*(a for a in FAST if not a.startswith(("trainer.max_steps", "trainer.micro_batch_size", "checkpoint.enabled"))),
        f"trainer.max_steps={STEPS}", "trainer.micro_batch_size=1", "checkpoint.enabled=true", "checkpoint.interval=2"]


def _logged(run_dir) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0


def _node(port: int, run_dir, layout: list[str], log, rdzv_conf: tuple[str, ...] = (), env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "tests" / "fixtures" / "torchrun_short_exit_barrier.py"), "--nnodes=1:2", "--nproc-per-node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{port}", *rdzv_conf, "--max-restarts=3",
           "--monitor-interval=0.5", "-m", "framework", *ARGS, *layout, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **(env or {})}
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def _listening(port: int) -> bool:
    """Whether a process on this machine listens on the TCP port (the rendezvous store is up)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except FileNotFoundError:
            continue
        if any(int(row[1].rsplit(":", 1)[1], 16) == port and row[3] == "0A" for row in rows):   # 0A: LISTEN
            return True
    return False


def _wait_until_listening(port: int, proc: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 300
    while not _listening(port):
        assert proc.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()[-4000:]
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    check_ok(run_framework([*ARGS, "parallel=single", "checkpoint.interval=0"], run_dir))   # the last step only
    return run_dir


@pytest.mark.parametrize("layout", [
    ["parallel=ddp"],
    ["parallel=fsdp", "zero=stage3"],
    ["parallel=3d", "parallel.tp=2", "parallel.pp=1"],    # tp2 x dp2 -> tp2 x dp1
], ids=["ddp", "fsdp", "3d_tp2"])
def test_losing_a_node_shrinks_the_group_and_keeps_the_curve(tmp_path, reference, layout):
    port = _free_port()
    run_dir = tmp_path / "run"
    with open(tmp_path / "host.log", "w") as host_log, open(tmp_path / "lost.log", "w") as lost_log:
        host = _node(port, run_dir, layout, host_log)     # first up: it hosts the rendezvous store
        _wait_until_listening(port, host, host_log)
        lost = _node(port, run_dir, layout, lost_log)
        try:
            deadline = time.monotonic() + 600
            while _logged(run_dir) < KILL_AT and host.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            killed_at = _logged(run_dir)
            os.killpg(lost.pid, signal.SIGKILL)
            assert host.wait(timeout=900) == 0, (tmp_path / "host.log").read_text()[-4000:]
        finally:
            for p in (host, lost):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    assert KILL_AT <= killed_at < STEPS, "the node was lost after the run ended: the test proves nothing"
    assert len(losses(run_dir)) == STEPS
    assert_parity(run_dir, reference)


JOIN_AT = 8
# The first node's group waits at step JOIN_AT + 2 (while it is 2 ranks) until the new node's arrival
# makes its agent stop it; however fast this machine trains, the join lands mid-run.
WAIT_FOR_JOIN = {"FRAMEWORK_FAULT": f"step:{JOIN_AT + 2}:world=2:do=hang"}


def test_a_joining_node_grows_the_group_and_keeps_the_curve(tmp_path, reference):
    port = _free_port()
    run_dir = tmp_path / "run"
    # last_call_timeout=1: the first node starts alone instead of waiting 30 s for a second one.
    conf = ("--rdzv-conf=last_call_timeout=1",)
    with open(tmp_path / "host.log", "w") as host_log, open(tmp_path / "joined.log", "w") as joined_log:
        host = _node(port, run_dir, ["parallel=ddp"], host_log, conf, WAIT_FOR_JOIN)
        joined = None
        try:
            deadline = time.monotonic() + 600
            while _logged(run_dir) < JOIN_AT and host.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            joined_at = _logged(run_dir)
            joined = _node(port, run_dir, ["parallel=ddp"], joined_log, conf)
            assert host.wait(timeout=900) == 0, (tmp_path / "host.log").read_text()[-4000:]
            assert joined.wait(timeout=300) == 0, (tmp_path / "joined.log").read_text()[-4000:]
        finally:
            for p in (host, joined):
                if p is not None and p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    assert JOIN_AT <= joined_at < STEPS, "the node joined after the run ended: the test proves nothing"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert records[0]["world_size"] == 2 and records[-1]["world_size"] == 4, [r["world_size"] for r in records]
    assert len(losses(run_dir)) == STEPS
    assert_parity(run_dir, reference)
