from __future__ import annotations

import resource
import sys

import torch


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for a tensor: the local shard of a DTensor, else the tensor itself."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**30 if sys.platform == "darwin" else 2**20)
