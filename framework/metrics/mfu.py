"""Model FLOPs utilisation: achieved model FLOP/s over the device's dense peak."""
from __future__ import annotations

import torch

# Dense bf16 tensor-core peaks in FLOP/s, matched by substring of torch.cuda.get_device_name().
GPU_PEAK_FLOPS = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("A10G", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
]


def peak_flops(device: torch.device, logging_cfg) -> float:
    if logging_cfg.peak_flops:
        return float(logging_cfg.peak_flops)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_PEAK_FLOPS:
            if key in name:
                return flops
        return 0.0   # unknown GPU: MFU reported as 0 rather than guessed
    return float(logging_cfg.cpu_peak_flops)


def mfu(flops_per_token: float, tokens_per_sec: float, peak_per_device: float, n_devices: int) -> float:
    if peak_per_device <= 0 or flops_per_token <= 0:
        return 0.0
    return flops_per_token * tokens_per_sec / (peak_per_device * n_devices)
