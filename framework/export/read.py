"""Full fp32 model weights out of a checkpoint step dir of any strategy, without process groups."""
from __future__ import annotations

import contextlib
import glob
import io
import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from framework import storage
from framework.checkpoint.dcp_reader import RestrictedLoadPlanner, first_failure, reader as dcp_reader
from framework.checkpoint.dcp_state import single_process_understood
from framework.checkpoint.deepspeed_files import check_deepspeed_files, deepspeed_loads_restricted, load_deepspeed_file
from framework.checkpoint.names import STATE
from framework.config.saved import saved_section
from framework.models.lora import base_read_target, dequantized

MODEL_PREFIX = "model."


def read_dcp(step_dir: str) -> dict[str, torch.Tensor]:
    """From a path or a URL (only the model's tensors are read: byte ranges of the state files)."""
    state_dir = storage.join(step_dir, STATE)
    reader = dcp_reader(state_dir)
    entries = reader.read_metadata().state_dict_metadata     # parsed once, with the allowlist
    # DCP stores each parameter's global size: full tensors here, whatever shards wrote them.
    names = {key[len(MODEL_PREFIX):]: meta for key, meta in entries.items()
             if key.startswith(MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata)}
    model = {name: torch.empty(meta.size, dtype=meta.properties.dtype) for name, meta in names.items()}
    # a LoRA run's frozen base weights may be stored as NF4 or float8, which read only into their own class
    adapted = {name[:-len(".lora_A")] for name in names if name.endswith(".lora_A")}
    base_dtype = _lora_config(step_dir).get("base_dtype") if adapted else None
    for module in adapted:
        target = base_read_target(names[f"{module}.weight"].size, base_dtype)
        if target is not None:
            model[f"{module}.weight"] = target
    state = {"model": model}
    try:
        with single_process_understood():
            dcp.load(state, storage_reader=reader, planner=RestrictedLoadPlanner(), no_dist=True)
    except CheckpointException as e:     # a BaseException: raise what the read ran into (a missing file)
        raise first_failure(e) from None
    return {name: dequantized(t, torch.float32) for name, t in state["model"].items()}


def _lora_config(step_dir: str):
    """The checkpoint's lora section, read as data (framework/config/saved.py)."""
    return saved_section(step_dir, "lora")


def read_deepspeed(step_dir: str) -> dict[str, torch.Tensor]:
    step_dir = storage.local_copy(step_dir)     # DeepSpeed's own reader takes a local dir
    state_dir = os.path.join(step_dir, STATE)
    check_deepspeed_files(state_dir)      # every file zero_to_fp32 reads, parsed weights only, naming a refusal
    if not glob.glob(os.path.join(state_dir, "*optim_states.pt")):
        # zero=none keeps no partitioned master copies: the module's own weights are the state.
        model_file = os.path.join(state_dir, "mp_rank_00_model_states.pt")
        module = load_deepspeed_file(model_file)["module"]
        return {name: t.float() for name, t in module.items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            deepspeed_loads_restricted():      # its own torch.load calls say weights_only=False
        state = get_fp32_state_dict_from_zero_checkpoint(step_dir, tag=STATE)
    # parameters without gradient (an MoE router's expert_bias, moved outside the gradient) have no partitioned
    # master copy under zero 1-2; the module's own state holds them whole
    model_file = os.path.join(state_dir, "mp_rank_00_model_states.pt")     # zero 1-2 (3 partitions its own)
    if os.path.isfile(model_file):
        module = load_deepspeed_file(model_file)["module"]
        for name, t in module.items():
            if name not in state and t.numel() > 0:
                state[name] = t
    return {name: t.float() for name, t in state.items()}


READERS = {"dcp": read_dcp, "deepspeed": read_deepspeed}
