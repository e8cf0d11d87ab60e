"""Model and optimizer state of torch-native strategies through torch.distributed.checkpoint.

State dicts are keyed by the unwrapped model's parameter names (DDP, FSDP2 and DTensor shards
all map to the same names), so a checkpoint written under one layout loads under another:
DCP gives every rank the slices its own shards need.
"""
from __future__ import annotations

import contextlib
import json
import warnings

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from framework import storage
from framework.checkpoint.dcp_reader import RestrictedLoadPlanner, first_failure, reader
from framework.checkpoint.staging import ReusedStager
from framework.checkpoint.unpickle import UnsafeCheckpointError

EXTRA = "extra.json"
# One key per parameter for optimizer states and hyper-parameters too: ranks that hold different
# parameters (ZeRO-1 shards, pipeline stages) then never write conflicting `param_groups` lists.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def writer(path: str):
    """DCP's writer for a path or a URL (fsspec; no fsync, which an object store's stream does not have: DCP would
    sync the whole machine's disks instead)."""
    if storage.is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
        return FsspecWriter(path, sync_files=False)
    return dcp.FileSystemWriter(path)


# What DCP warns at every save and load without a process group (with no_dist, which asks for exactly that);
# the warning's frame is DCP's decorator, so `return func(*args, **kwargs)` was printed after it.
SINGLE_PROCESS_WARNING = (r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent is to "
                          r"(save|load) in a single process")


@contextlib.contextmanager
def single_process_understood():
    """DCP's calls without a process group, less its warning that they have none (that one only)."""
    if dist.is_initialized():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING, category=UserWarning)
        yield


def save(path: str, model, optimizer, scheduler, precision, background: bool = False, group=None,
         stager: ReusedStager | None = None):
    """Write the state. background: stage a CPU copy (into `stager`'s buffers), write it from a thread
    over `group`, and return a Future that completes when the files are on disk."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    if not dist.is_initialized() or dist.get_rank() == 0:
        storage.makedirs(path)
        storage.write_text(storage.join(path, EXTRA),
                           json.dumps({"scheduler": scheduler.state_dict(), "precision": precision.state_dict()}))
    with single_process_understood():
        if background:
            return dcp.async_save(state, storage_writer=writer(path), process_group=group,
                                  no_dist=not dist.is_initialized(), async_stager=stager)
        dcp.save(state, storage_writer=writer(path), no_dist=not dist.is_initialized())
    return None


def load(path: str, model, optimizer, scheduler, precision) -> None:
    """Restore the state; a file that would run code is refused (UnsafeCheckpointError) on every rank."""
    state_reader = reader(path)
    state_reader.read_metadata()      # refused here, before DCP, which would log a traceback and look further
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        with single_process_understood():
            dcp.load(state, storage_reader=state_reader, planner=RestrictedLoadPlanner(),
                     no_dist=not dist.is_initialized())
    except CheckpointException as e:    # every rank gets every rank's failures
        if isinstance(first_failure(e), UnsafeCheckpointError):
            raise first_failure(e) from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=OPTIONS)
    extra = json.loads(storage.read_text(storage.join(path, EXTRA)))
    # After the optimizer's: the schedule decides the learning rate, set on the scheduler's own optimizer
    # (under ZeRO-1 that is not the one whose state was loaded: it steps an inner one).
    scheduler.load_state_dict(extra["scheduler"])
    precision.load_state_dict(extra["precision"])
