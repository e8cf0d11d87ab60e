"""Model and optimizer state of torch-native strategies through torch.distributed.checkpoint.

State dicts are keyed by the unwrapped model's parameter names (DDP, FSDP2 and DTensor shards
all map to the same names), so a checkpoint written under one layout loads under another:
DCP gives every rank the slices its own shards need.
"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from framework.checkpoint.safety import check_dcp_metadata
from framework.checkpoint.staging import ReusedStager

EXTRA = "extra.json"
# One key per parameter for optimizer states and hyper-parameters too: ranks that hold different
# parameters (ZeRO-1 shards, pipeline stages) then never write conflicting `param_groups` lists.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def save(path: str, model, optimizer, scheduler, precision, background: bool = False, group=None,
         stager: ReusedStager | None = None):
    """Write the state. background: stage a CPU copy (into `stager`'s buffers), write it from a thread
    over `group`, and return a Future that completes when the files are on disk."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, EXTRA), "w") as f:
            json.dump({"scheduler": scheduler.state_dict(), "precision": precision.state_dict()}, f)
    if background:
        return dcp.async_save(state, checkpoint_id=path, process_group=group, no_dist=not dist.is_initialized(),
                              async_stager=stager)
    dcp.save(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    return None


def load(path: str, model, optimizer, scheduler, precision) -> None:
    check_dcp_metadata(path)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIONS)
    with open(os.path.join(path, EXTRA)) as f:
        extra = json.load(f)
    scheduler.load_state_dict(extra["scheduler"])
    # The schedule decides the learning rate. Setting it on the scheduler's own optimizer matters where
    # that is not the one whose state was loaded (ZeRO-1 steps an inner optimizer under an outer one).
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    precision.load_state_dict(extra["precision"])
