"""Rank discovery: each launcher's variables, as plain env dicts, give the right shape and numbers."""
import pytest

from framework.runtime.cluster_env import Node, Worker, discover, expand_hostlist, port_for_job


@pytest.mark.parametrize("hostlist,hosts", [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[8-10],login1", ["a8", "a9", "a10", "login1"]),
    ("n[001-002],m[1,3]", ["n001", "n002", "m1", "m3"]),
    # the examples of SLURM's own documentation (slurm.conf, the hostlist API, scontrol show hostnames)
    ("linux[1-3,6]", ["linux1", "linux2", "linux3", "linux6"]),
    ("node1,node[2-5,12]", ["node1", "node2", "node3", "node4", "node5", "node12"]),
    ("tux[0-2,12,20-21]", ["tux0", "tux1", "tux2", "tux12", "tux20", "tux21"]),
    ("lx[15,18,32-33]", ["lx15", "lx18", "lx32", "lx33"]),
    ("rack[0-1]_blade[0-1]", ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"]),
    # several bracket groups: the first host, the job's master, was '-node01'... 'rack1' before
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("r[1-2]n[8-10],login1", ["r1n8", "r1n9", "r1n10", "r2n8", "r2n9", "r2n10", "login1"]),
    ("gpu[098-100] cpu7", ["gpu098", "gpu099", "gpu100", "cpu7"]),      # white space separates too
])
def test_slurm_hostlists_expand(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def test_the_master_of_a_two_bracket_node_list_is_its_first_host():
    env = {**SLURM, "SLURM_JOB_NODELIST": "rack[1-2]-node[01-02]", "SLURM_NNODES": "4", "SLURM_NTASKS": "4",
           "SLURM_PROCID": "2", "SLURM_NODEID": "2"}
    assert discover(env).master_addr == "rack1-node01"


def test_plain_process_and_torchrun_workers_are_left_alone():
    assert discover({}) is None
    assert discover({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "1", "RANK": "3", "SLURM_PROCID": "0",
                     "SLURM_STEP_ID": "0"}) is None


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2"}


def test_slurm_one_task_per_device_is_a_worker_of_the_group():
    env = {**SLURM, "SLURM_NTASKS": "16", "SLURM_PROCID": "11", "SLURM_LOCALID": "3", "SLURM_NODEID": "1"}
    w = discover(env)
    assert w == Worker("slurm", rank=11, world_size=16, local_rank=3, local_world_size=8, master_addr="gpu07",
                       master_port=port_for_job("4242"), job_id="4242")
    assert w.torch_env() == {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
                             "MASTER_ADDR": "gpu07", "MASTER_PORT": str(port_for_job("4242"))}
    assert not w.is_rank_zero


def test_slurm_one_task_per_node_spawns_its_workers_at_a_c10d_rendezvous_on_the_first_host():
    env = {**SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
    assert discover(env) == Node("slurm", node_rank=1, min_nodes=2, max_nodes=2, nproc_per_node=None,
                                 master_addr="gpu07", master_port=port_for_job("4242"), rdzv_backend="c10d",
                                 job_id="4242")


def test_slurm_batch_script_and_single_task_jobs_run_as_on_a_laptop():
    assert discover({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is None   # no srun step
    assert discover({**SLURM, "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None


def test_ports_differ_across_jobs_and_stay_in_range():
    ports = {port_for_job(str(j)) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(20000 <= p < 40000 for p in ports)
    assert port_for_job("123_4") == port_for_job("1234")   # array jobs: digits only


def test_submitit_local_tasks_are_workers_on_this_host():
    env = {"SUBMITIT_LOCAL_JOB_ID": "31337", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
           "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NODEID": "0"}
    assert discover(env) == Worker("submitit", 1, 2, 1, 2, "localhost", port_for_job("31337"), "31337")


def test_kubeflow_trainer_pet_variables_make_a_node_with_a_static_rendezvous():
    env = {"PET_NNODES": "4", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "8", "PET_MASTER_ADDR": "job-node-0-0.job",
           "PET_MASTER_PORT": "29400"}
    node = discover(env)
    assert node == Node("trainjob", 2, 4, 4, 8, "job-node-0-0.job", 29400, "static")
    assert not node.is_rank_zero


def test_elastic_pet_nnodes_range_uses_c10d():
    node = discover({"PET_NNODES": "1:2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "h", "PET_MASTER_PORT": "1"})
    assert (node.min_nodes, node.max_nodes, node.rdzv_backend, node.nproc_per_node) == (1, 2, "c10d", None)


def test_pytorchjob_rank_is_the_node_index_not_the_process_rank():
    env = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "8", "RANK": "1",
           "PET_NPROC_PER_NODE": "4"}
    assert discover(env) == Node("pytorchjob", node_rank=1, min_nodes=2, max_nodes=2, nproc_per_node=4,
                                 master_addr="job-master-0", master_port=23456, rdzv_backend="static")


def test_pytorchjob_with_one_process_per_pod_is_a_worker():
    env = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    assert discover(env) == Worker("pytorchjob", 2, 3, 0, 1, "job-master-0", 23456)
