"""Each launcher's variables on a GPU node (GPUs stubbed at torch.cuda): validation counts this node's
workers, not the job's, and a job's default run dir is the same on every attempt."""
import os
import types

import pytest
import torch

from framework.errors import ConfigError
from framework.launch import admission
from framework.runtime import devices
from framework.runtime.cluster_env import discover, stable_job_dir, tasks_per_node

CUDA = types.SimpleNamespace(device="cuda")
LAUNCHER_VARS = ("LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SUBMITIT_LOCAL_JOB_ID", "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture
def eight_gpus(monkeypatch):
    for key in [k for k in os.environ if k.startswith(("SLURM_", "PET_")) or k in LAUNCHER_VARS]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    return monkeypatch


def slurm_task(procid, ntasks, nodes, **extra):
    per_node = ntasks // nodes
    return {"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]",
            "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid % per_node), "SLURM_NODEID": str(procid // per_node),
            "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})", **extra}


LAUNCHERS = {   # name: (env of one process, the job's world size, workers it puts on this node)
    "torchrun": ({"TORCHELASTIC_RUN_ID": "j", "LOCAL_RANK": "3", "RANK": "11", "WORLD_SIZE": "32",
                  "LOCAL_WORLD_SIZE": "8"}, 32, 8),
    "srun --ntasks-per-node=8": (slurm_task(11, 32, 4, SLURM_NTASKS_PER_NODE="8"), 32, 8),
    "srun -n 32 -N 4": (slurm_task(11, 32, 4), 32, 8),
    "srun, one task per node": (slurm_task(1, 4, 4), 32, 8),
    "kubeflow trainjob": ({"PET_NNODES": "4", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8",
                           "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"}, 32, 8),
    "pytorchjob": ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "1", "WORLD_SIZE": "32", "RANK": "1",
                    "PET_NPROC_PER_NODE": "8"}, 32, 8),
    "submitit": ({"SUBMITIT_LOCAL_JOB_ID": "5", "SUBMITIT_LOCAL_NTASKS": "8", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
                  "SUBMITIT_LOCAL_GLOBALID": "3", "SUBMITIT_LOCAL_LOCALID": "3", "SUBMITIT_LOCAL_NODEID": "0"}, 8, 8),
}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_each_launchers_job_fits_a_node_of_8_gpus(eight_gpus, name):
    env, world, local = LAUNCHERS[name]
    for key, value in env.items():
        eight_gpus.setenv(key, value)
    assert devices.local_workers(world) == local
    devices.check_visible_gpus(CUDA, world)     # was: "32 workers on this node but 8 visible GPUs" for srun


def test_more_srun_tasks_on_a_node_than_gpus_is_refused_naming_srun(eight_gpus):
    for key, value in slurm_task(0, 32, 2).items():
        eight_gpus.setenv(key, value)
    with pytest.raises(ConfigError, match="16 workers on this node but 8 visible GPUs; set srun's --ntasks-per-node"):
        devices.check_visible_gpus(CUDA, 32)


@pytest.mark.parametrize("binding", [{"SLURM_GPUS_PER_TASK": "1"}, {"SLURM_GPU_BIND": "single:1"}],
                         ids=["--gpus-per-task=1", "--gpu-bind"])
def test_srun_tasks_bound_to_a_gpu_each_train_on_the_one_they_see(eight_gpus, binding):
    eight_gpus.setattr(torch.cuda, "device_count", lambda: 1)      # SLURM shows each task its own GPU only
    for key, value in slurm_task(7, 16, 4, **binding).items():     # local rank 3 of 4 tasks on this node
        eight_gpus.setenv(key, value)
    devices.check_visible_gpus(CUDA, 16)    # was: "4 workers on this node but 1 visible GPU"
    worker = discover(os.environ)
    assert worker.torch_env()["LOCAL_RANK"] == "0" and worker.torch_env()["LOCAL_WORLD_SIZE"] == "4"
    eight_gpus.setenv("LOCAL_RANK", worker.torch_env()["LOCAL_RANK"])
    assert devices.local_gpu() == 0          # the device every rank of the task sets (torch, DeepSpeed: LOCAL_RANK)


def test_unbound_srun_tasks_sharing_one_gpu_are_still_refused(eight_gpus):
    eight_gpus.setattr(torch.cuda, "device_count", lambda: 1)
    for key, value in slurm_task(7, 16, 4).items():
        eight_gpus.setenv(key, value)
    with pytest.raises(ConfigError, match="4 workers on this node but 1 visible GPU; set srun's --ntasks-per-node"):
        devices.check_visible_gpus(CUDA, 16)


@pytest.mark.parametrize("value,counts", [("8(x4)", [8] * 4), ("8,4", [8, 4]), ("8(x2),4", [8, 8, 4]), ("1", [1])])
def test_slurm_tasks_per_node_expands(value, counts):
    assert tasks_per_node(value) == counts


def test_uneven_slurm_layout_gives_each_node_its_own_count():
    env = slurm_task(9, 12, 2, SLURM_TASKS_PER_NODE="8,4", SLURM_NODEID="1", SLURM_LOCALID="1")
    assert discover(env).local_world_size == 4


@pytest.mark.parametrize("env,run_dir", [
    ({"SLURM_JOB_ID": "777"}, "outputs/slurm/777"),                     # the batch script itself, one task
    (slurm_task(3, 32, 4), "outputs/slurm/777"),                        # every srun task
    ({"SLURM_JOB_ID": "801", "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "1"}, "outputs/slurm/800_1"),
    ({"SUBMITIT_LOCAL_JOB_ID": "31337"}, "outputs/submitit/31337"),
    ({"TORCHELASTIC_RUN_ID": "pretrain-8b", "LOCAL_RANK": "0"}, "outputs/torchrun/pretrain-8b"),
    ({"PET_NNODES": "4", "PET_MASTER_ADDR": "llama-node-0-0.llama"}, "outputs/kubeflow/llama-node-0-0"),
    ({"TORCHELASTIC_RUN_ID": "none", "LOCAL_RANK": "0"}, None),          # torchrun's default id: every launch
    ({"TORCHELASTIC_RUN_ID": "0f8e1c2a-1b2c-4d3e-8f9a-0123456789ab", "LOCAL_RANK": "0"}, None),  # --standalone
    ({}, None),
])
def test_a_job_identity_gives_the_same_run_dir_on_every_attempt(env, run_dir):
    assert stable_job_dir(env) == run_dir


def test_default_run_dir_of_a_requeued_slurm_job_is_its_job_dir(eight_gpus):
    eight_gpus.setenv("SLURM_JOB_ID", "777")
    assert admission.agree_run_dir("outputs/2026-01-01/00-00-00") == "outputs/slurm/777"
    eight_gpus.delenv("SLURM_JOB_ID")
    assert admission.agree_run_dir("outputs/2026-01-01/00-00-00") == "outputs/2026-01-01/00-00-00"


def test_an_srun_step_smaller_than_the_allocation_counts_its_own_tasks():
    env = slurm_task(1, 8, 4, SLURM_NTASKS_PER_NODE="8", SLURM_TASKS_PER_NODE="8(x4)",
                     SLURM_STEP_TASKS_PER_NODE="2(x4)", SLURM_LOCALID="1", SLURM_NODEID="0")
    assert discover(env).local_world_size == 2
