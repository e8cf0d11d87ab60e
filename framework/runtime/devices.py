"""What the job's device means for a process: CUDA or CPU, how many workers the node can hold,
the process group (backend, a world of one), CPU threads per worker, native bf16 and TF32 matmuls.

Every CUDA question here reads device properties only: none opens a CUDA context, so the launcher
and torchrun ranks can ask before a worker has picked its GPU.
"""
from __future__ import annotations

import os
import socket

import torch

from framework.errors import ConfigError
from framework.runtime.cluster_env import Node, Worker, discover


def device_type(cfg) -> str:
    """"cuda" or "cpu": what `device=auto|cpu|cuda` resolves to on this machine."""
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def local_workers(world_size: int) -> int:
    """Workers on this node: torchrun's LOCAL_WORLD_SIZE (1 if it does not say); a SLURM/submitit task
    or Kubeflow pod: the tasks or processes the cluster puts on this node (framework.runtime.cluster_env);
    else every worker (we spawn them all here)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return 1
    placement = discover(os.environ)
    if isinstance(placement, Worker):
        return placement.local_world_size
    if isinstance(placement, Node):
        return max(1, world_size // placement.max_nodes)
    return world_size


def _who_sets_local_workers() -> str:
    if "LOCAL_WORLD_SIZE" in os.environ:
        return "torchrun's --nproc-per-node"
    placement = discover(os.environ)
    if isinstance(placement, Worker) and placement.source == "slurm":
        return "srun's --ntasks-per-node"
    if isinstance(placement, Worker):
        return f"{placement.source}'s tasks per node"
    return "launcher.nproc_per_node"


def own_gpu_per_task() -> bool:
    """Whether the launcher gave this process a GPU of its own (srun --gpus-per-task=1, --gpu-bind): it then
    sees only that one, whatever its local rank."""
    placement = discover(os.environ)
    return isinstance(placement, Worker) and placement.own_gpu


def check_visible_gpus(cfg, world_size: int) -> None:
    """One GPU per worker: a second rank on one GPU dies at set_device or is refused by NCCL."""
    if device_type(cfg) != "cuda":
        return
    need, gpus = (1 if own_gpu_per_task() else local_workers(world_size)), torch.cuda.device_count()
    if need > gpus:
        raise ConfigError("launcher.nproc_per_node",
                          f"{need} workers on this node but {gpus} visible GPU{'s' if gpus != 1 else ''}; "
                          f"set {_who_sets_local_workers()} to at most {gpus} (one GPU per worker) or device=cpu")


def process_group_backend(cfg, device: torch.device) -> str:
    """gloo on CPU; on CUDA nccl, plus gloo for CPU tensors where offloading leaves some to reduce
    (FSDP's CPU-offloaded gradient shards in the grad-norm all-reduce)."""
    if cfg.launcher.backend:
        return cfg.launcher.backend
    if device.type != "cuda":
        return "gloo"
    z = cfg.zero
    return "cuda:nccl,cpu:gloo" if z.offload_params or z.offload_optimizer else "nccl"


def join_one_process_world() -> None:
    """Make this process a world of one (rank 0, a free local port) where no launcher made it a rank:
    parallel strategies need a process group even when they run alone (one GPU, one worker)."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def threads_per_worker(local_world: int) -> int:
    """This node's cores shared out among its workers (at least one each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world))


def prepare_worker(cfg, device: torch.device) -> None:
    """Process-wide settings of a worker, before its process group and model exist.

    Threads: torchrun sets OMP_NUM_THREADS=1 (a CPU-offloaded optimizer then steps on one core) and
    our own spawn sets nothing (every worker would use every core); both become cores / local workers.
    """
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world > 1:   # one worker alone keeps torch's own default
        torch.set_num_threads(threads_per_worker(local_world))
    if device.type == "cuda":
        # The allow_tf32 flags also set torch's newer fp32_precision switches, so code reading either
        # API agrees (setting the newer ones makes a read of the old flags raise).
        torch.backends.cuda.matmul.allow_tf32 = cfg.precision.allow_tf32
        torch.backends.cudnn.allow_tf32 = cfg.precision.allow_tf32


def local_gpu() -> int:
    """The GPU index this process trains on (the first one in the launcher that spawns the workers; 0 in a
    task that sees only its own GPU: framework.runtime.cluster_env.Worker.torch_env)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def native_bf16(device_index: int) -> bool:
    """bf16 in hardware on this GPU; pre-Ampere GPUs (V100, T4) only emulate it, slowly. torch's
    device guard only records the index where the GPU has no context yet, so none is opened."""
    with torch.cuda.device(device_index):
        return torch.cuda.is_bf16_supported(including_emulation=False)
