"""A 2-"node" job started the way each Kubeflow manifest starts it: the manifest's own command and
ConfigMap, in every pod, with the env the operator sets there. Losses, grad norms and weights equal
single's."""
import os
import socket
import subprocess
import sys

import pytest
import yaml

from framework.k8s.manifests import CONFIG_DIR
from tests.harness.helpers import FAST, REPO, SAVE_LAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def trainjob_env(job: dict, node_rank: int, port: int) -> dict:
    """What Kubeflow Trainer's torch-distributed runtime sets in each node's pod."""
    t = job["spec"]["trainer"]
    return {"PET_NNODES": str(t["numNodes"]), "PET_NPROC_PER_NODE": str(t["numProcPerNode"]),
            "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": "localhost", "PET_MASTER_PORT": str(port)}


def pytorchjob_env(job: dict, node_rank: int, port: int) -> dict:
    """What the training operator (pkg/controller.v1/pytorch/envvar.go) sets in the Master and Worker pods."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    nodes = sum(s["replicas"] for s in specs.values())
    nproc = int(job["spec"]["nprocPerNode"])
    return {"MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "PET_MASTER_ADDR": "localhost",
            "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(nodes * nproc), "RANK": str(node_rank),
            "PET_NODE_RANK": str(node_rank), "PET_NPROC_PER_NODE": str(nproc), "PET_NNODES": str(nodes),
            "PYTHONUNBUFFERED": "1"}


def command_of(job: dict) -> list[str]:
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]["command"]
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]


def run_pods(command: list[str], envs: list[dict], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(command, cwd=REPO, env={**os.environ, **e}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in envs]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(command, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


@pytest.mark.parametrize("kind,node_env", [("trainjob", trainjob_env), ("pytorchjob", pytorchjob_env)])
def test_two_nodes_started_like_the_manifest_match_single(tmp_path, reference_run, kind, node_env):
    runs = tmp_path / "runs"
    made = run_framework(["--kind", kind, "--image", "unused", "--nodes", "2", "--runs-path", str(runs),
                          *FAST, SAVE_LAST, "parallel=ddp", "launcher.nproc_per_node=1"], module="framework.k8s")
    check_ok(made)
    config_map, job = yaml.safe_load_all(made.stdout)
    # the ConfigMap, mounted where the command looks for it
    mounted = tmp_path / "etc"
    mounted.mkdir()
    (mounted / "config.yaml").write_text(config_map["data"]["config.yaml"])
    command = [str(mounted) if arg == CONFIG_DIR else arg for arg in command_of(job)]
    assert command[:3] == ["python", "-m", "framework"]
    port = free_port()
    for proc in run_pods([sys.executable, *command[1:]], [node_env(job, r, port) for r in (0, 1)]):
        check_ok(proc)
    assert len(losses(runs / job["metadata"]["name"])) == 8
    assert_parity(runs / job["metadata"]["name"], reference_run())
