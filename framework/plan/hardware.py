"""The devices the planner knows: memory, bandwidths and (from framework.metrics.mfu) dense peaks.
Bandwidths are per GPU and per direction: HBM, the intra-node link (NVLink / Infinity Fabric) and the
inter-node NIC. `cpu` is this machine, measured on the spot (matmul throughput, memory copy bandwidth)."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

from framework.errors import ConfigError
from framework.metrics.mfu import GPU_PEAK_FLOPS

log = logging.getLogger(__name__)

GB = 1e9
GIB = 1024 ** 3
# gloo between processes sharing a few cores: one collective (FSDP unit gather, TP all-reduce) costs
# about 2 ms however small, as benchmarks/plan_step_time.py measures on a 2-core machine
CPU_COLLECTIVE_LATENCY_S = 2e-3


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    peak_flops: dict            # dtype -> dense FLOP/s
    hbm_bw: float
    intra_bw: float             # per GPU, per direction, within a node
    inter_bw: float             # per GPU, per direction, across nodes
    fp8_flops: float = 0.0
    efficiency: float = 0.55    # the share of peak a well-fed transformer step reaches (MFU ceiling)
    op_overhead_s: float = 5e-6  # fixed cost of one kernel launch / operator call, whatever its size
    pcie_bw: float = 25 * GB     # device <-> host, for offloaded states
    collective_latency_s: float = 30e-6   # fixed cost of one collective (NCCL small-message latency)
    host_bw: float = 100 * GB    # host memory, where an offloaded optimizer steps
    cores: int = 0               # CPU: the cores workers share (0: every worker has its own device)
    torch_device: str = ""       # where this host can run the job to time it ("cuda": the detected GPU)

    def worker_peak(self, dtype_peak: float, world: int) -> float:
        """FLOP/s one of `world` workers gets: the whole device, or its share of the CPU's cores."""
        if not self.cores:
            return dtype_peak
        per_core = dtype_peak / self.cores
        return per_core * max(1, self.cores // world) / max(1.0, world / self.cores)

    def latency(self, world: int) -> float:
        """Fixed cost of one collective among `world` workers: with more workers than cores, each waits
        for its peers to be scheduled, in proportion."""
        return self.collective_latency_s * (max(1.0, world / self.cores) if self.cores else 1.0)


_GPUS = {
    # name: (table key in mfu, HBM bytes, HBM B/s, intra-node B/s, inter-node B/s, fp8 dense FLOP/s)
    # Sources: NVIDIA's H100 (SXM5 / PCIe) and H200 datasheets (HBM, NVLink 900 / PCIe Gen5 128 GB/s both
    # directions), the A100 datasheet (NVLink 600 GB/s both directions), the DGX B200 datasheet (NVLink5
    # 1.8 TB/s), AMD's MI300X datasheet (Infinity Fabric 896 GB/s); inter-node: one 400 Gb/s NIC per GPU
    # (200 Gb/s on A100 systems)
    "h100": ("H100", 80 * GIB, 3.35e12, 450 * GB, 50 * GB, 1979e12),
    # torchtitan's Llama 3.1 benchmarks (docs/performance.md, benchmarks/llama3_h100_202412_torchtitan.md):
    # Grand Teton hosts, 8 H100s on NVLink, "96GB HBM2e with 2.4 TB/sec", 400 Gb/s RDMA per GPU; 94.5 GiB
    # of its 96 GiB usable ("128 H100 (94GB memory)"), as the 80 GB part shows 79.1 of 80 GiB
    "h100_96gb": ("H100", int(94.5 * GIB), 2.4e12, 450 * GB, 50 * GB, 1979e12),
    "h100_pcie": ("H100 PCIe", 80 * GIB, 2.0e12, 64 * GB, 50 * GB, 1513e12),
    "h200": ("H200", 141 * GIB, 4.8e12, 450 * GB, 50 * GB, 1979e12),
    "a100_40gb": ("A100", 40 * GIB, 1.555e12, 300 * GB, 25 * GB, 0.0),
    "a100_80gb": ("A100", 80 * GIB, 2.0e12, 300 * GB, 25 * GB, 0.0),
    "b200": ("B200", 180 * GIB, 8.0e12, 900 * GB, 50 * GB, 4500e12),
    "mi300x": ("MI300X", 192 * GIB, 5.3e12, 448 * GB, 50 * GB, 2615e12),
}
# Parts run below their datasheet's clocks: torchtitan's hosts keep the H100s at a 500 W power limit (not
# 700 W) and say their "actual peak TFLOPs number is between SXM and NVL" (989 and 835 dense bf16
# TFLOP/s); the middle of the two is at most 8.5% from it
_PEAK_SHARE = {"h100_96gb": (989 + 835) / 2 / 989}
NAMES = (*_GPUS, "cpu")


def device_named(name: str) -> Device:
    key = name.lower().replace("-", "_")
    if key == "cpu":
        return measured_cpu()
    if key not in _GPUS:
        raise ConfigError("planner.device", f"unknown device {name!r}; use one of {', '.join(NAMES)}")
    table, memory, hbm, intra, inter, fp8 = _GPUS[key]
    share = _PEAK_SHARE.get(key, 1.0)
    peaks = {dtype: flops * share for dtype, flops in GPU_PEAK_FLOPS[table].items()}
    return Device(key, memory, peaks, hbm, intra, inter, fp8 * share)


# What a GPU neither table row describes is planned with: a PCIe-class card's links and HBM, and (when the
# MFU table lacks it too) an A100's peaks; each guessed figure is named in a warning.
_GUESS = ("A100", 0, 1.5e12, 64 * GB, 25 * GB, 0.0)


def _row_for(table: str | None, memory: int | None):
    """(key, row) of the planner's entry for an MFU table key (of two, the one nearest in memory); None."""
    rows = [(key, row) for key, row in _GPUS.items() if row[0] == table]
    return min(rows, key=lambda kr: abs(kr[1][1] - (memory or 0))) if rows else None


def detected_device() -> Device | None:
    """The visible GPU as the planner sees it; None without one. Memory is the device's own
    (torch.cuda.get_device_properties), peaks come from the MFU table and bandwidths from the planner's:
    whatever torch cannot tell and no table knows is guessed, with a warning naming it."""
    if not torch.cuda.is_available():
        return None
    from framework.metrics.mfu import match_device
    name = torch.cuda.get_device_name(0)
    table = match_device(name)
    memory = getattr(torch.cuda.get_device_properties(0), "total_memory", None)
    known = _row_for(table, memory)
    key, row = known if known else (name, _GUESS)
    guessed = [] if known else ["bandwidths (HBM, NVLink, network) of a PCIe card"]
    peaks = GPU_PEAK_FLOPS.get(table)
    if peaks is None:
        peaks = GPU_PEAK_FLOPS[_GUESS[0]]
        guessed.append(f"peak FLOP/s of an {_GUESS[0]}")
    if not memory:
        memory = row[1] or 40 * GIB
        guessed.append(f"{memory / GIB:.0f} GiB of memory")
    if guessed:
        log.warning("planner: %s is planned with a guess for its %s (planner.device=<one of %s> plans for a "
                    "device the planner knows)", name, ", ".join(guessed), ", ".join(_GPUS))
    return Device(key, memory, dict(peaks), row[2], row[3], row[4], row[5], torch_device="cuda")


def _best_rate(work: float, op, windows: int, window_s: float) -> float:
    """`work` per call of `op`, per second, in the fastest of `windows` short windows: the machine's own rate,
    not a share another process took (on a busy host one long window reads the load, not the peak)."""
    op()
    best = 0.0
    for _ in range(windows):
        start, reps = time.perf_counter(), 0
        while time.perf_counter() - start < window_s:
            op()
            reps += 1
        best = max(best, work * reps / (time.perf_counter() - start))
    return best


@lru_cache(maxsize=1)
def measured_cpu() -> Device:
    """This host: fp32 matmul FLOP/s over the threads one worker gets, memory copy bandwidth."""
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = _best_rate(2 * n ** 3, lambda: a @ b, windows=8, window_s=0.025)
    x = torch.empty(16 * 1024 * 1024 // 4)
    y = torch.empty_like(x)
    copy_bw = _best_rate(x.numel() * 4, lambda: y.copy_(x), windows=5, window_s=0.02)
    small = torch.ones(8)
    op_overhead = 1 / _best_rate(1, lambda: small.add(small), windows=5, window_s=0.01)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # bf16 matmuls on a CPU without AMX run several times slower than fp32
    peaks = {"fp32": flops, "tf32": flops, "bf16": flops / 4, "fp16": flops / 4}
    # gloo over loopback moves tensors at a fraction of a memory copy; a transformer step's mix of
    # matmuls and element-wise ops reaches about 0.6 of the big-matmul rate, for models too large for
    # framework/plan/cpu_calibration.py to time
    return Device("cpu", memory, peaks, copy_bw, copy_bw / 4, copy_bw / 4, efficiency=0.6, op_overhead_s=op_overhead,
                  pcie_bw=copy_bw, host_bw=copy_bw, cores=torch.get_num_threads(),
                  collective_latency_s=CPU_COLLECTIVE_LATENCY_S)
