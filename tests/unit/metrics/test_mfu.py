"""MFU's peak: per device (whole-word, longest-match names) and per dtype the matmuls run in."""
import logging
from types import SimpleNamespace

import pytest
import torch

from framework.metrics import mfu
from tests.fixtures import fake_gpus


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 NVL", "H100 NVL"),          # not the SXM part's "H100"
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),                    # not "H200"
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"),                    # not "L4"
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A10G", "A10G"),                  # not "A10"
    ("NVIDIA A800-SXM4-80GB", "A800"),
    ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),                # not "B200"
    ("NVIDIA H800", "H800"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 4080", None),
    ("Some Future GPU", None),
])
def test_device_names_match_whole_words_longest_first(name, key):
    assert mfu.match_device(name) == key


@pytest.mark.parametrize("precision,expected", [
    ({"name": "bf16"}, 989e12),
    ({"name": "fp16"}, 989e12),
    ({"name": "fp32", "allow_tf32": True}, 494e12),
    ({"name": "fp32", "allow_tf32": False}, 67e12),
])
def test_peak_follows_the_dtype_the_matmuls_run_in(precision, expected):
    dtype = mfu.matmul_dtype(SimpleNamespace(get=lambda k, d=None: precision.get(k, d), **precision))
    assert mfu.gpu_peak_flops("NVIDIA H100 80GB HBM3", dtype) == expected


def test_no_tf32_cores_means_the_fp32_peak_and_no_bf16_means_zero(caplog):
    assert mfu.gpu_peak_flops("Tesla V100-SXM2-16GB", "tf32") == 15.7e12
    with caplog.at_level(logging.WARNING, logger=mfu.__name__):
        assert mfu.gpu_peak_flops("Tesla V100-SXM2-16GB", "bf16") == 0.0
    assert "V100 has no bf16" in caplog.text


def test_unknown_device_warns_and_reports_zero(caplog):
    with caplog.at_level(logging.WARNING, logger=mfu.__name__):
        assert mfu.gpu_peak_flops("NVIDIA GeForce RTX 4080", "bf16") == 0.0
    assert "no peak FLOP/s known for 'NVIDIA GeForce RTX 4080'" in caplog.text
    assert "logging.peak_flops" in caplog.text


def test_peak_flops_reads_the_cuda_device_name_and_precision(compose_config, monkeypatch):
    fake_gpus.install(1, name="NVIDIA A100-SXM4-40GB", major=8, setattr=monkeypatch.setattr)
    cuda = torch.device("cuda", 0)
    fp32 = compose_config(["precision=fp32"])
    assert mfu.peak_flops(cuda, fp32.logging, fp32.precision) == 156e12         # TF32 by default
    no_tf32 = compose_config(["precision=fp32", "precision.allow_tf32=false"])
    assert mfu.peak_flops(cuda, no_tf32.logging, no_tf32.precision) == 19.5e12
    bf16 = compose_config(["precision=bf16"])
    assert mfu.peak_flops(cuda, bf16.logging, bf16.precision) == 312e12
    given = compose_config(["precision=bf16", "logging.peak_flops=1e15"])
    assert mfu.peak_flops(cuda, given.logging, given.precision) == 1e15
    assert mfu.peak_flops(torch.device("cpu"), bf16.logging, bf16.precision) == bf16.logging.cpu_peak_flops
