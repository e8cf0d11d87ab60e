"""Model FLOPs utilisation: achieved model FLOP/s over the device's dense peak for the dtype the
matmuls run in (bf16/fp16 tensor cores, TF32 for fp32 with precision.allow_tf32, else plain fp32).
"""
from __future__ import annotations

import logging
import re

import torch

log = logging.getLogger(__name__)

# Dense (not 2:4-sparse) datasheet peaks in FLOP/s per device. Keys are matched against
# torch.cuda.get_device_name() as whole words ("L4" is not "L40"); the longest matching key wins
# ("H100 NVL" over "H100"). A dtype a device lacks in hardware (bf16 and TF32 before Ampere) is absent.
GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "B200": {"bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 75e12},
    "GB200": {"bf16": 2500e12, "fp16": 2500e12, "tf32": 1250e12, "fp32": 90e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},        # SXM ("H100 80GB HBM3")
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 418e12, "fp32": 60e12},
    "H800": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H800 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H20": {"bf16": 148e12, "fp16": 148e12, "tf32": 74e12, "fp32": 44e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "A800": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
    "A10G": {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},   # as the A10
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "L40": {"bf16": 181e12, "fp16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "T4": {"fp16": 65e12, "fp32": 8.1e12},
    "RTX 4090": {"bf16": 165e12, "fp16": 165e12, "tf32": 82.6e12, "fp32": 82.6e12},
    "RTX 3090": {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12},
    "MI300X": {"bf16": 1307e12, "fp16": 1307e12, "tf32": 654e12, "fp32": 163e12},   # "AMD Instinct MI300X"
    "MI325X": {"bf16": 1307e12, "fp16": 1307e12, "tf32": 654e12, "fp32": 163e12},
}


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[\s\-_/]+", name.upper()) if w]


def match_device(name: str) -> str | None:
    """The table key naming this device: all its words appear consecutively in `name`; longest wins."""
    words = _words(name)
    found = None
    for key in GPU_PEAK_FLOPS:
        k = _words(key)
        if any(words[i:i + len(k)] == k for i in range(len(words) - len(k) + 1)):
            if found is None or len(k) > len(_words(found)):
                found = key
    return found


def matmul_dtype(precision_cfg) -> str:
    """The table column a step's matmuls run in."""
    if precision_cfg.name in ("bf16", "fp16"):
        return precision_cfg.name
    if precision_cfg.name == "float8":
        return "bf16"       # the model's FLOPs against the bf16 peak, so float8's gain shows as MFU
    return "tf32" if precision_cfg.get("allow_tf32", True) else "fp32"


def gpu_peak_flops(name: str, dtype: str) -> float:
    """The table's peak for this device and dtype; 0 (MFU reported as 0) with a warning if unknown.
    TF32 falls back to fp32 on devices without TF32 tensor cores."""
    key = match_device(name)
    if key is None:
        log.warning("MFU: no peak FLOP/s known for %r; mfu is reported as 0 (set logging.peak_flops)", name)
        return 0.0
    peaks = GPU_PEAK_FLOPS[key]
    if dtype == "tf32" and dtype not in peaks:
        dtype = "fp32"
    if dtype not in peaks:
        log.warning("MFU: %s has no %s tensor cores in the table; mfu is reported as 0 "
                    "(set logging.peak_flops)", key, dtype)
        return 0.0
    return peaks[dtype]


def peak_flops(device: torch.device, logging_cfg, precision_cfg) -> float:
    if logging_cfg.peak_flops:
        return float(logging_cfg.peak_flops)
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), matmul_dtype(precision_cfg))
    return float(logging_cfg.cpu_peak_flops)


def mfu(flops_per_token: float, tokens_per_sec: float, peak_per_device: float, n_devices: int) -> float:
    if peak_per_device <= 0 or flops_per_token <= 0:
        return 0.0
    return flops_per_token * tokens_per_sec / (peak_per_device * n_devices)
