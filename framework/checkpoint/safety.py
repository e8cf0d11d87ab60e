"""Nothing in a checkpoint is unpickled unless every class it names is on an allowlist.

torch.distributed.checkpoint reads its `.metadata` file with plain pickle, which would run
any code a crafted file asks for. Before DCP reads it, the file is parsed here by an
unpickler whose find_class admits only DCP's own metadata dataclasses and torch's
size/dtype/layout markers, so a file naming anything else is refused before any code runs.
"""
from __future__ import annotations

import glob
import io
import os
import pickle

import torch

from framework import storage

_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


# The only non-tensor classes DeepSpeed's engine files name (optimizer bookkeeping).
_DEEPSPEED_GLOBALS = {
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
}


class UnsafeCheckpointError(ValueError):
    pass


class _AllowlistUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        is_memory_format = module == "torch" and isinstance(getattr(torch, name, None), torch.memory_format)
        if module.startswith(_ALLOWED_MODULES) or (module, name) in _ALLOWED or is_dtype or is_memory_format:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(f"refuses to unpickle {module}.{name}")


def check_dcp_metadata(state_dir: str) -> None:
    """Parse a DCP checkpoint's .metadata with the allowlist; raise UnsafeCheckpointError otherwise."""
    path = storage.join(state_dir, ".metadata")
    data = storage.read_bytes(path)
    try:
        _AllowlistUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError as e:
        raise UnsafeCheckpointError(f"{path}: {e}; the file is not a checkpoint this framework wrote") from None
    except Exception as e:
        raise UnsafeCheckpointError(f"{path}: unreadable checkpoint metadata ({type(e).__name__})") from None


def load_tensors_only(path: str):
    """torch.load of small extra state: plain tensors and containers only, never arbitrary objects."""
    try:
        return torch.load(io.BytesIO(storage.read_bytes(path)), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(f"{path}: refused to load ({str(e).splitlines()[0]})") from None


def check_deepspeed_files(state_dir: str) -> None:
    """DeepSpeed's loaders unpickle with weights_only=False: refuse files that name any other class first."""
    files = glob.glob(os.path.join(state_dir, "*.pt"))
    if not files:
        raise UnsafeCheckpointError(f"{state_dir} holds no DeepSpeed checkpoint files")
    for path in files:
        try:
            named = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception as e:
            raise UnsafeCheckpointError(f"{path}: unreadable ({type(e).__name__})") from None
        if named - _DEEPSPEED_GLOBALS:
            raise UnsafeCheckpointError(f"{path}: refuses to unpickle {sorted(named - _DEEPSPEED_GLOBALS)[0]}; "
                                        f"the file is not a checkpoint this framework wrote")
