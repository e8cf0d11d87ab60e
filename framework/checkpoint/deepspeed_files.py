"""DeepSpeed's engine files (`state/*.pt`), read weights only.

DeepSpeed loads them with torch.load(weights_only=False): in its checkpoint engine during a resume (the
strategy swaps in RestrictedCheckpointEngine) and in zero_to_fp32 during an export. Both run inside
`deepspeed_loads_restricted`, and every file is first parsed here by `check_deepspeed_files`, so that a
refusal names its file before DeepSpeed opens any.
"""
from __future__ import annotations

import glob
import os

from framework.checkpoint.unpickle import UnsafeCheckpointError, load_torch, torch_loads_restricted

# What DeepSpeed's engine files hold besides tensors and containers (optimizer bookkeeping), as zero 0-3 in
# fp32 and bf16 with and without optimizer offload write them; DynamicLossScaler is fp16's (CUDA only).
DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def load_deepspeed_file(path: str, map_location="cpu", mmap: bool = False):
    """One engine file, weights only (mmap: its tensors mapped, not read: a check of what it names)."""
    return load_torch(path, path, DEEPSPEED_GLOBALS, map_location, mmap)


def check_deepspeed_files(state_dir: str) -> None:
    """Parse every engine file of a local state dir weights only; raise UnsafeCheckpointError on the first
    that names anything else."""
    files = sorted(glob.glob(os.path.join(state_dir, "*.pt")))
    if not files:
        raise UnsafeCheckpointError(f"{state_dir} holds no DeepSpeed checkpoint files")
    for path in files:
        load_deepspeed_file(path, mmap=True)


def deepspeed_loads_restricted():
    """DeepSpeed's own torch.load calls weights only, with its classes, while inside."""
    return torch_loads_restricted(DEEPSPEED_GLOBALS)
