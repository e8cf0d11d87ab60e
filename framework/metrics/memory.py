from __future__ import annotations

import resource
import sys

import torch


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for a tensor: the local shard of a DTensor; the tensors a wrapper subclass holds
    (torchao's quantised optimizer states: codes and scales); else the tensor itself."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(local_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


class IntervalPeakMemory:
    """Peak memory since the last reset, so each log record covers only its own training steps
    (the trainer resets after logging, evaluating and checkpointing).

    CUDA: peak allocated (tensors) and peak reserved (tensors plus the caching allocator's free blocks).
    CPU: both are the process's peak resident set, which Linux lets us reset through /proc/self/clear_refs;
    elsewhere it is the lifetime peak.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def read(self) -> dict[str, float]:
        if self.device.type == "cuda":
            return {"memory_gb": torch.cuda.max_memory_allocated(self.device) / 2**30,
                    "memory_reserved_gb": torch.cuda.max_memory_reserved(self.device) / 2**30}
        rss = _peak_rss_bytes() / 2**30
        return {"memory_gb": rss, "memory_reserved_gb": rss}

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")   # resets the peak resident set (VmHWM) to the current one
        except OSError:
            pass


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
