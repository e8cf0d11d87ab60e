"""GPU health through NVML, stubbed (tests/fixtures/fake_nvml/pynvml.py stands in for nvidia-ml-py): each
rank's readings reach rank 0's records, and a GPU whose uncorrectable ECC count grows stops the job with
exit_codes.GPU_FAULT, naming host and GPU."""
import importlib.util
import os
import socket

import pytest
import torch

from framework import exit_codes
from framework.metrics import gpu_health
from framework.metrics.gpu_health import FIELDS, GpuFault, GpuHealth
from tests.harness.helpers import FAST, REPO, read_metrics, run_framework

FAKE_NVML = REPO / "tests" / "fixtures" / "fake_nvml"


def _fake_nvml():
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(nvml, gpu: int) -> dict[str, float]:
    """What the stub reports for GPU `gpu`, read through its own functions and the units of the record."""
    h = nvml.nvmlDeviceGetHandleByIndex(gpu)
    return {"temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000,
            "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "throttle_reasons": nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            "ecc_corrected": nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, 0),
            "ecc_uncorrected": 0}


def test_readings_then_a_new_uncorrectable_error_stops(monkeypatch):
    monkeypatch.setenv("FAKE_NVML_ECC", "1:3")       # GPU 1's third uncorrected-ECC reading counts one
    nvml = _fake_nvml()
    monkeypatch.setattr(gpu_health, "_open_nvml", lambda: nvml)
    health = GpuHealth(torch.device("cpu"), local_rank=1)     # reading 1: the baseline
    assert health.read() == {f"gpu/0/{k}": float(v) for k, v in _expected(_fake_nvml(), 1).items()}   # reading 2
    with pytest.raises(GpuFault, match=rf"rank 0 \(host {socket.gethostname()}, GPU 1 \(GPU-fake-1\)\) reported 1 "
                                       rf"new uncorrectable"):
        health.read()


def test_without_nvml_nothing_is_read(monkeypatch):
    monkeypatch.setattr(gpu_health, "_open_nvml", lambda: None)
    assert GpuHealth(torch.device("cpu"), local_rank=0).read() == {}


def test_every_rank_reported_and_a_new_ecc_error_stops_the_job(tmp_path):
    """DDP x2: rank r reads fake GPU r. GPU 1's uncorrected count rises at its 4th reading (the baseline, then
    steps 1, 2, 3): steps 1 and 2 carry both ranks' readings, and step 3 stops the job with GPU_FAULT."""
    run_dir = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]), "FAKE_NVML_ECC": "1:4"}
    proc = run_framework([*FAST, "parallel=ddp", "launcher.nproc_per_node=2"], run_dir, env=env)
    assert proc.returncode == exit_codes.GPU_FAULT, proc.stderr[-3000:]
    # the launcher's own last line names the GPU: rank 0's print can be lost when rank 1 exits first
    last = proc.stderr.strip().splitlines()[-1]
    assert "stopped on a GPU fault: rank 1 (host " in last, proc.stderr[-3000:]
    assert (f"rank 1 (host {socket.gethostname()}, GPU 1 (GPU-fake-1)) reported 1 new uncorrectable ECC error(s)"
            in last), proc.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    nvml = _fake_nvml()
    for record in records:
        for rank in (0, 1):
            assert {k: record[f"gpu/{rank}/{k}"] for k in FIELDS} == _expected(nvml, rank)
