"""Rank discovery: what the launcher that started this process says about the job, read from its env.

Two shapes come out of it:

- `Worker`: this process is one rank of the group (SLURM or submitit with one task per device, a
  PyTorchJob pod running one process). Its torch variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
  MASTER_PORT, ...) are exported and the group forms from them (`env://`).
- `Node`: this process stands for a whole node (Kubeflow Trainer / PyTorchJob with `PET_*`, SLURM or
  submitit with one task per node) and spawns its workers through torch's elastic launcher, which
  meets the other nodes at a rendezvous.

torchrun's own workers (TORCHELASTIC_RUN_ID) and a plain process on a laptop give None: launch
does what it always did. Nothing here touches os.environ; `discover` takes any mapping so every
launcher's shape is unit-tested with a plain dict.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Mapping, Optional

# A port in a range no common service uses, the same on every node of a job and different across jobs.
PORT_BASE, PORT_SPAN = 20000, 20000


def port_for_job(job_id: str) -> int:
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


@dataclass(frozen=True)
class Worker:
    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    job_id: Optional[str] = None
    own_gpu: bool = False    # the launcher gave each task its own GPU (srun --gpus-per-task, --gpu-bind): the one it sees

    def torch_env(self) -> dict[str, str]:
        # LOCAL_RANK is the GPU index to torch, DeepSpeed and us: a task that sees only its own GPU uses GPU 0
        local_rank = 0 if self.own_gpu else self.local_rank
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Node:
    source: str
    node_rank: int
    min_nodes: int
    max_nodes: int
    nproc_per_node: Optional[int]   # None: the launcher did not say; launcher.nproc_per_node decides
    master_addr: str
    master_port: int
    rdzv_backend: str               # static: ranks follow node_rank; c10d: nodes join in any order
    job_id: Optional[str] = None

    @property
    def is_rank_zero(self) -> bool:
        return self.node_rank == 0


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list -> host names, in SLURM's order: items split at commas (and white space)
    outside brackets; in an item each bracket group is a comma list of numbers and ranges, zero padding kept,
    several groups giving every combination, the first group varying slowest. 'gpu[01-03,07],login1' ->
    gpu01 gpu02 gpu03 gpu07 login1; 'rack[1-2]-node[01-02]' -> rack1-node01 rack1-node02 rack2-node01 ..."""
    return [host for item in _hostlist_items(hostlist) for host in _expand_item(item)]


def _hostlist_items(hostlist: str) -> list[str]:
    items, current, depth = [], "", 0
    for char in hostlist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0 and (char == "," or char.isspace()):
            items.append(current)
            current = ""
        else:
            current += char
    return [item for item in items + [current] if item]


def _expand_item(item: str) -> list[str]:
    """'rack[1-2]-node[01-02]' -> the names of every combination of its bracket groups."""
    parts = re.split(r"\[([^\]]*)\]", item)     # text, group, text, group, ..., text
    choices = [[text] if i % 2 == 0 else _bracket_values(text) for i, text in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _bracket_values(group: str) -> list[str]:
    """'01-03,07' -> 01 02 03 07: a range keeps the width of its first bound."""
    values = []
    for part in group.split(","):
        lo, _, hi = part.strip().partition("-")
        values += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    return values


def tasks_per_node(value: str) -> list[int]:
    """SLURM_TASKS_PER_NODE -> tasks on each node in node order: '8(x4)' -> 8 8 8 8, '8(x2),4' -> 8 8 4."""
    counts = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", value):
        counts += [int(count)] * int(repeat or 1)
    return counts


def _local_tasks(env: Mapping[str, str], tasks: int, nodes: int, node_id: Optional[int]) -> int:
    """Tasks on this node as SLURM lays out the step (srun's own layout first: an `srun -n` inside an
    allocation differs from the job's --ntasks-per-node), else an even share. SLURM sets no
    LOCAL_WORLD_SIZE, and the job's whole task count is not this node's."""
    per_node = _int(env, "SLURM_NTASKS_PER_NODE")
    for layout in (env.get("SLURM_STEP_TASKS_PER_NODE", ""), f"{per_node}(x{nodes})" if per_node else "",
                   env.get("SLURM_TASKS_PER_NODE", "")):
        counts = tasks_per_node(layout)
        if counts and sum(counts) == tasks:
            return counts[min(node_id or 0, len(counts) - 1)]
    return max(1, tasks // nodes)


def _int(env: Mapping[str, str], key: str) -> Optional[int]:
    value = env.get(key, "")
    return int(value) if value.strip().isdigit() else None


def _nnodes(value: str) -> tuple[int, int]:
    """torchrun's --nnodes: 'N' or 'MIN:MAX'."""
    lo, _, hi = value.partition(":")
    return int(lo), int(hi or lo)


def _kubeflow(env: Mapping[str, str]) -> Node | Worker | None:
    """Kubeflow Trainer v2 (torch-distributed runtime) sets torchrun's PET_* variables; PyTorchJob
    (kubeflow.org/v1) sets MASTER_ADDR/MASTER_PORT, RANK = the pod's index (a node, not a process) and,
    with nprocPerNode, PET_NPROC_PER_NODE and WORLD_SIZE = pods x processes per pod."""
    nproc = _int(env, "PET_NPROC_PER_NODE")
    addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    port = _int(env, "PET_MASTER_PORT") or _int(env, "MASTER_PORT")
    if "PET_NNODES" in env:
        lo, hi = _nnodes(env["PET_NNODES"])
    elif nproc and _int(env, "WORLD_SIZE"):
        lo = hi = _int(env, "WORLD_SIZE") // nproc
    elif addr and port and _int(env, "WORLD_SIZE") and _int(env, "RANK") is not None:
        # an older PyTorchJob: one process per pod, RANK is then the process rank too
        return Worker("pytorchjob", _int(env, "RANK"), _int(env, "WORLD_SIZE"), 0, 1, addr, port)
    else:
        return None
    node_rank = _int(env, "PET_NODE_RANK")
    if node_rank is None:
        node_rank = _int(env, "RANK") or 0
    source = "trainjob" if "PET_NNODES" in env and "RANK" not in env else "pytorchjob"
    return Node(source, node_rank, lo, hi, nproc, addr or "localhost", port or 29500,
                "static" if lo == hi else "c10d")


def _scheduler(env: Mapping[str, str], source: str, job_id: str, rank: str, ntasks: str, local_rank: str,
               nnodes: str, node_id: str, first_host: str, own_gpu: bool = False) -> Node | Worker | None:
    tasks, nodes = _int(env, ntasks) or 1, _int(env, nnodes) or 1
    port = port_for_job(job_id)
    if tasks == nodes == 1:
        return None      # one task on one node: spawn workers on this host as on a laptop
    if tasks == nodes:   # one task per node: it spawns the node's workers, meeting at the first host
        return Node(source, _int(env, node_id) or 0, nodes, nodes, None, first_host, port, "c10d", job_id)
    return Worker(source, _int(env, rank) or 0, tasks, _int(env, local_rank) or 0,
                  _local_tasks(env, tasks, nodes, _int(env, node_id)), first_host, port, job_id, own_gpu)


def discover(env: Mapping[str, str]) -> Node | Worker | None:
    if "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env:
        return None     # torchrun's worker: torch already set everything up
    if "SUBMITIT_LOCAL_JOB_ID" in env:
        # submitit's local executor: the same names submitit.JobEnvironment reads, all on this host
        return _scheduler(env, "submitit", env["SUBMITIT_LOCAL_JOB_ID"], "SUBMITIT_LOCAL_GLOBALID",
                          "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_JOB_NUM_NODES",
                          "SUBMITIT_LOCAL_NODEID", "localhost")
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        # a task of an srun step (submitit's SLURM jobs are such steps); the batch script itself is not
        job_id = env.get("SLURM_JOB_ID", "0")
        hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost")
        return _scheduler(env, "slurm", job_id, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                            "SLURM_NNODES" if "SLURM_NNODES" in env else "SLURM_JOB_NUM_NODES",
                            "SLURM_NODEID", hosts[0], own_gpu=_gpus_bound_per_task(env))
    return _kubeflow(env)


def _gpus_bound_per_task(env: Mapping[str, str]) -> bool:
    """srun --gpus-per-task or --gpu-bind: SLURM shows each task only the GPUs bound to it (variables srun sets
    only with those options)."""
    return bool(env.get("SLURM_GPUS_PER_TASK") or env.get("SLURM_GPU_BIND"))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def stable_job_dir(env: Mapping[str, str]) -> Optional[str]:
    """A run dir that a requeued or restarted job finds again, from the job's own identity: SLURM's job id
    (array job id and task: the batch script, srun steps and submitit alike), submitit's local job id, a
    rendezvous id the user gave torchrun, a Kubeflow job's master host (its pods' service name).
    None where the launcher gives no such identity: the caller keeps its timestamped dir."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"outputs/slurm/{_safe(env['SLURM_ARRAY_JOB_ID'])}_{_safe(env['SLURM_ARRAY_TASK_ID'])}"
    if env.get("SLURM_JOB_ID"):
        return f"outputs/slurm/{_safe(env['SLURM_JOB_ID'])}"
    if env.get("SUBMITIT_LOCAL_JOB_ID"):
        return f"outputs/submitit/{_safe(env['SUBMITIT_LOCAL_JOB_ID'])}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none" and not _GENERATED_ID.fullmatch(run_id):
        return f"outputs/torchrun/{_safe(run_id)}"
    if "PET_NNODES" in env or "PET_NPROC_PER_NODE" in env:
        host = (env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR") or "").split(".")[0]
        if host and host not in ("localhost", "127"):
            return f"outputs/kubeflow/{_safe(host)}"
    return None


# torchrun's own run ids: 'none' (its --rdzv-id default) or a uuid4 (--standalone): new for every launch
_GENERATED_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
