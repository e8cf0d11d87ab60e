"""Each rank's GPU through NVML (nvidia-ml-py's `pynvml`), read on the steps that write a record:
temperature, power, SM clock, clock-event (throttle) reasons and ECC error counts, gathered into rank 0's
record as `gpu/<rank>/<field>`. A GPU that reports uncorrectable ECC errors it did not have when the job
started stops the job on every rank (GpuFault: exit_codes.GPU_FAULT), naming host and GPU, so that the
restart can leave that node out.

The GPU of a rank is its CUDA device (found in NVML by UUID); a rank that trains on the CPU of a host that
has GPUs reads the one at its local rank's index. Where pynvml is missing or finds no GPU, nothing is read
and the records have no gpu/ keys. The ranks agree once, at the start, whether any of them reads.
"""
from __future__ import annotations

import math
import os
import socket

import torch
import torch.distributed as dist

FIELDS = ("temperature_c", "power_w", "sm_clock_mhz", "throttle_reasons", "ecc_corrected", "ecc_uncorrected")
UNCORRECTED = FIELDS.index("ecc_uncorrected")


class GpuFault(RuntimeError):
    """A GPU reported new uncorrectable ECC errors: the job stops on every rank."""


def _open_nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:        # not installed, or no driver / no GPU (NVMLError_LibraryNotFound, ...)
        return None


def _rank_gpu(nvml, device: torch.device, local_rank: int):
    """(NVML handle, "GPU <index> (<uuid>)") of the rank's GPU, or None."""
    try:
        if device.type == "cuda":
            try:
                uuid = str(torch.cuda.get_device_properties(device).uuid)
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            except Exception:
                if "CUDA_VISIBLE_DEVICES" in os.environ:    # CUDA's indices are not NVML's then
                    return None
                handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
        elif local_rank < nvml.nvmlDeviceGetCount():
            handle = nvml.nvmlDeviceGetHandleByIndex(local_rank)
        else:
            return None
        return handle, f"GPU {nvml.nvmlDeviceGetIndex(handle)} ({_text(nvml.nvmlDeviceGetUUID(handle))})"
    except Exception:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuHealth:
    def __init__(self, device: torch.device, local_rank: int, enabled: bool = True):
        self.device = device      # where the gather's tensors live (NCCL gathers CUDA tensors)
        self.nvml = _open_nvml() if enabled else None
        found = _rank_gpu(self.nvml, device, local_rank) if self.nvml is not None else None
        self.handle, gpu = found if found else (None, "no GPU")
        self.gathers = dist.is_initialized() and dist.get_world_size() > 1
        names = [f"host {socket.gethostname()}, {gpu}"]
        if self.gathers:
            names = [None] * dist.get_world_size()
            dist.all_gather_object(names, f"host {socket.gethostname()}, {gpu}")
        self.names = names
        self.on = any(not name.endswith("no GPU") for name in names)
        self.baseline = self._gather()[:, UNCORRECTED] if self.on else None

    def _read(self) -> list[float]:
        if self.handle is None:
            return [math.nan] * len(FIELDS)
        n, h = self.nvml, self.handle
        clock_events = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        reads = (lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                 lambda: n.nvmlDeviceGetPowerUsage(h) / 1000,              # mW
                 lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                 lambda: clock_events(h),                                  # a bit mask, nvmlClocksEventReason*
                 lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
                 lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC))
        values = []
        for read in reads:
            try:
                values.append(float(read()))
            except Exception:    # NVMLError_NotSupported: a GPU without ECC, a field the driver lacks
                values.append(math.nan)
        return values

    def _gather(self) -> torch.Tensor:
        """(world, len(FIELDS)) readings of every rank."""
        mine = torch.tensor(self._read(), dtype=torch.float64, device=self.device)
        if not self.gathers:
            return mine.unsqueeze(0).cpu()
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        return torch.stack(every).cpu()

    def read(self) -> dict[str, float]:
        """Every rank's readings as record keys (every rank calls it, on the same steps); GpuFault where a
        GPU has more uncorrectable ECC errors than at the start."""
        if not self.on:
            return {}
        readings = self._gather()
        new = readings[:, UNCORRECTED] - self.baseline
        for rank in (new > 0).nonzero().flatten().tolist():
            host = self.names[rank].split(",")[0].removeprefix("host ")
            raise GpuFault(f"rank {rank} ({self.names[rank]}) reported {int(new[rank])} new uncorrectable ECC "
                           f"error(s) since the job started; restart without {host} (SLURM: --exclude={host})")
        return {f"gpu/{rank}/{field}": value for rank, row in enumerate(readings.tolist())
                for field, value in zip(FIELDS, row) if not math.isnan(value)}
