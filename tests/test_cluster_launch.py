"""A 2-"node" job started the way each Kubeflow manifest starts it: the same command on every node,
with only the environment the operator sets telling the nodes apart. Losses equal single's."""
import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import FAST, REPO, check_ok, losses, max_rel_diff

TOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_nodes(node_envs: list[dict], args: list[str], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """`python -m framework ARGS` once per node, all at the same time."""
    cmd = [sys.executable, "-m", "framework", *args]
    procs = [subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **e},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in node_envs]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out


def trainjob_env(node_rank: int, port: int) -> dict:
    """What Kubeflow Trainer's torch-distributed runtime sets in each node's pod."""
    return {"PET_NNODES": "2", "PET_NODE_RANK": str(node_rank), "PET_NPROC_PER_NODE": "1",
            "PET_MASTER_ADDR": "localhost", "PET_MASTER_PORT": str(port)}


def pytorchjob_env(node_rank: int, port: int) -> dict:
    """What the training operator sets in a PyTorchJob's Master (rank 0) and Worker pods (nprocPerNode: 1)."""
    return {"MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(node_rank),
            "PET_NPROC_PER_NODE": "1"}


@pytest.mark.parametrize("node_env", [trainjob_env, pytorchjob_env], ids=["trainjob", "pytorchjob"])
def test_two_nodes_started_like_the_manifest_match_single(tmp_path, single_reference, node_env):
    run_dir = tmp_path / "run"
    port = free_port()
    nodes = run_nodes([node_env(r, port) for r in (0, 1)], [*FAST, "parallel=ddp", f"hydra.run.dir={run_dir}"])
    for proc in nodes:
        check_ok(proc)
    got = losses(run_dir)
    assert len(got) == 8
    assert max_rel_diff(single_reference(), got) <= TOL
