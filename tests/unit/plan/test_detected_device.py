"""The planner plans the visible GPU (torch.cuda stubbed): its own memory, the MFU table's peaks, and a
warning naming every figure it had to guess."""
import logging
from types import SimpleNamespace

import pytest
import torch

from framework.metrics.mfu import GPU_PEAK_FLOPS
from framework.plan import hardware

GIB = 1024 ** 3


def _gpu(monkeypatch, name, total_memory=None):
    props = SimpleNamespace(major=9, minor=0, name=name)
    if total_memory is not None:
        props.total_memory = total_memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


def test_a_gpu_the_planner_knows_is_planned_with_its_own_memory_and_no_warning(monkeypatch, caplog):
    _gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 79 * GIB)
    with caplog.at_level(logging.WARNING, logger=hardware.__name__):
        device = hardware.detected_device()
    assert (device.name, device.memory_bytes) == ("a100_80gb", 79 * GIB)   # the 80 GB row, not the 40 GB one
    assert device.peak_flops == GPU_PEAK_FLOPS["A100"]
    assert caplog.text == ""


def test_a_gpu_only_the_mfu_table_knows_is_a_gpu_with_its_peaks_and_memory(monkeypatch, caplog):
    _gpu(monkeypatch, "NVIDIA H100 NVL", 94 * GIB)
    with caplog.at_level(logging.WARNING, logger=hardware.__name__):
        device = hardware.detected_device()
    assert device is not None and device.cores == 0 and device.memory_bytes == 94 * GIB
    assert device.peak_flops == GPU_PEAK_FLOPS["H100 NVL"]
    assert "NVIDIA H100 NVL is planned with a guess for its bandwidths" in caplog.text
    assert "peak" not in caplog.text and "memory" not in caplog.text


def test_a_gpu_no_table_knows_is_still_a_gpu_and_each_guess_is_named(monkeypatch, caplog):
    _gpu(monkeypatch, "Some Future GPU")                                   # torch gives no total_memory
    with caplog.at_level(logging.WARNING, logger=hardware.__name__):
        device = hardware.detected_device()
    assert device is not None and device.name != "cpu" and device.memory_bytes > 0
    for guess in ("bandwidths", "peak FLOP/s", "GiB of memory"):
        assert guess in caplog.text


def test_the_plan_refuses_a_job_too_big_for_a_detected_unknown_gpu(monkeypatch):
    """Was: an H100 NVL was not detected, so the fit check was skipped without a word."""
    from framework.errors import ConfigError
    from framework.plan.check import refuse_if_it_cannot_fit
    from hydra import compose, initialize_config_dir

    from framework.config.paths import CONFIG_DIR
    from framework.compose.config_store import register_configs
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=["model=llama_125m", "data.seq_len=1024", "trainer.global_batch_size=8",
                                           "trainer.micro_batch_size=8"])
    _gpu(monkeypatch, "NVIDIA H100 NVL", 1 * GIB)
    with pytest.raises(ConfigError, match="one NVIDIA H100 NVL holds 1.0 GiB"):
        refuse_if_it_cannot_fit(cfg, 1, lambda c: None)
