"""How many workers a job has: the one place that decides, for the launcher, validation and the planner.

Whoever started the processes says first (torchrun's WORLD_SIZE, a SLURM step or Kubeflow pod through
framework.runtime.cluster_env); then launcher.nproc_per_node; then, on CUDA where the strategy takes any number
of workers, one per visible GPU; else the number the strategy's degrees ask for (`workers_wanted`).
"""
from __future__ import annotations

import os

import torch

from framework.runtime.cluster_env import Node, Worker, discover
from framework.runtime.devices import device_type


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ


#: workers on a CPU for a job that takes any number (ddp, deepspeed, parallel=auto) when nothing says
OPEN_CPU_WORKERS = 2


def world_size_is_open(cfg, strategy_cls) -> bool:
    """Whether the job runs with any number of workers: ddp and deepspeed, degrees with a -1, or
    parallel=auto (strategy_cls None: the planner picks a layout for whatever world it is given)."""
    p = cfg.parallel
    return (strategy_cls is None or strategy_cls.default_workers > 1
            or -1 in (p.dp_replicate, p.dp_shard, p.tp, p.pp))


def spawned_workers(cfg, strategy_cls) -> int:
    """Workers to spawn when neither torchrun nor launcher.nproc_per_node says: one per visible GPU on
    CUDA where the job leaves the count open, else what its degrees (or its CPU default) ask for."""
    if device_type(cfg) == "cuda" and world_size_is_open(cfg, strategy_cls):
        return max(1, torch.cuda.device_count())
    return OPEN_CPU_WORKERS if strategy_cls is None else strategy_cls.workers_wanted(cfg)


def nproc_for_node(cfg, strategy_cls, node: Node | None) -> int:
    if node is None:
        return cfg.launcher.nproc_per_node or spawned_workers(cfg, strategy_cls)
    return (node.nproc_per_node or cfg.launcher.nproc_per_node
            or max(1, spawned_workers(cfg, strategy_cls) // node.max_nodes))


def world_size_for(cfg, strategy_cls) -> int:
    """The job's world size; strategy_cls None for parallel=auto."""
    if under_torchrun():
        return int(os.environ["WORLD_SIZE"])
    placement = discover(os.environ)
    if isinstance(placement, Worker):
        return placement.world_size
    if isinstance(placement, Node):
        return nproc_for_node(cfg, strategy_cls, placement) * placement.max_nodes
    return nproc_for_node(cfg, strategy_cls, None)
