"""What only a GPU job would show, checked on CPU with the CUDA boundary stubbed: the process-group
backend, one worker per GPU, native bf16 on the worker's own GPU, TF32, and CPU threads per worker.
"""
import os
from datetime import timedelta

import pytest
import torch

from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.launch import admission
from framework.parallel import precision
from framework.runtime import world
from framework.runtime import devices
from framework.strategies import runtime as strategy_runtime
from framework.strategies.registry import strategy_class
from tests.fixtures import fake_gpus
from tests.harness.helpers import FAST, run_framework, train_run
from tests.harness.parity import assert_parity

TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@pytest.fixture
def composer(compose_config):
    return lambda *args: compose_config([*FAST, *args])


@pytest.fixture
def gpus(monkeypatch):
    """Stub this process's CUDA boundary to show `n` GPUs (undone after the test)."""
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    precision.compute_supported.cache_clear()
    yield lambda *args, **kwargs: fake_gpus.install(*args, **kwargs, setattr=monkeypatch.setattr)
    precision.compute_supported.cache_clear()


@pytest.fixture
def tf32_flags():
    """Put torch's TF32 switches back (their modules do not let monkeypatch undo a setattr)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _RuntimeOnly(strategy_runtime.Strategy):
    """The worker-side interface alone: what every strategy's setup_distributed shares (the methods a real
    strategy must define are not called here)."""
    setup = forward_backward = optimizer_step = eval_loss = save_checkpoint = load_checkpoint = None


# ---- 1. process-group backend ------------------------------------------------------------

@pytest.mark.parametrize("args,device,expected", [
    ([], "cpu", "gloo"),
    (["parallel=fsdp", "zero=stage3", "zero.offload_params=true"], "cpu", "gloo"),
    (["parallel=fsdp", "zero=stage3"], "cuda", "nccl"),
    # CPU-offloaded gradient shards are all-reduced for the grad norm: they need a CPU backend too.
    (["parallel=fsdp", "zero=stage3", "zero.offload_params=true"], "cuda", "cuda:nccl,cpu:gloo"),
    (["parallel=deepspeed", "zero=stage2", "zero.offload_optimizer=true"], "cuda", "cuda:nccl,cpu:gloo"),
    (["parallel=fsdp", "zero.offload_params=true", "launcher.backend=nccl"], "cuda", "nccl"),
])
def test_backend_adds_gloo_for_cpu_tensors_when_offloading_on_cuda(composer, args, device, expected):
    assert devices.process_group_backend(composer(*args), torch.device(device)) == expected


def test_setup_distributed_creates_the_group_with_that_backend(composer, monkeypatch, tf32_flags):
    cfg = composer("parallel=fsdp", "zero=stage3", "zero.offload_params=true", "precision.allow_tf32=false")
    calls = []
    monkeypatch.setattr(strategy_runtime.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(strategy_runtime.dist, "init_process_group", lambda **kw: calls.append(kw))
    c10d = strategy_runtime.dist.distributed_c10d     # init_default_group sets the default timeout of later groups
    monkeypatch.setattr(c10d, "default_pg_timeout", c10d.default_pg_timeout)
    monkeypatch.setattr(c10d, "default_pg_nccl_timeout", c10d.default_pg_nccl_timeout)
    # A spawned worker's environment: the elastic agent sets LOCAL_WORLD_SIZE, nobody sets OMP_NUM_THREADS.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    strategy = _RuntimeOnly(cfg)
    strategy.device = torch.device("cuda", 0)   # as _pick_device returns on a GPU
    strategy.setup_distributed()
    assert calls == [{"backend": "cuda:nccl,cpu:gloo", "device_id": torch.device("cuda", 0),
                      "timeout": timedelta(seconds=cfg.launcher.timeout_s)}]
    assert threads == [8]                                     # 16 cores / 2 local workers, on CUDA too
    assert torch.backends.cuda.matmul.allow_tf32 is False     # precision.allow_tf32=false reaches the worker


# ---- 2. one worker per GPU ---------------------------------------------------------------

def test_more_workers_than_gpus_is_refused(composer, gpus):
    gpus(1)
    cfg = composer("parallel=ddp", "launcher.nproc_per_node=2")
    with pytest.raises(ConfigError) as err:
        derive_and_validate(cfg, 2, strategy_class("ddp"))
    assert str(err.value) == ("launcher.nproc_per_node: 2 workers on this node but 1 visible GPU; set "
                              "launcher.nproc_per_node to at most 1 (one GPU per worker) or device=cpu")


def test_torchrun_local_world_above_gpus_is_refused(composer, gpus, monkeypatch):
    gpus(4)
    for key, value in dict(TORCHELASTIC_RUN_ID="t", LOCAL_RANK="0", RANK="0", WORLD_SIZE="16",
                           LOCAL_WORLD_SIZE="8").items():
        monkeypatch.setenv(key, value)
    cfg = composer("parallel=ddp")
    with pytest.raises(ConfigError) as err:
        devices.check_visible_gpus(cfg, 16)
    assert "8 workers on this node but 4 visible GPUs; set torchrun's --nproc-per-node to at most 4" in str(err.value)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    devices.check_visible_gpus(cfg, 16)       # 4 nodes x 4 GPUs: fine


def test_device_cpu_ignores_the_gpus(composer, gpus):
    gpus(1)
    devices.check_visible_gpus(composer("parallel=ddp", "device=cpu"), 2)


@pytest.mark.parametrize("args,expected", [
    (["parallel=ddp"], 4),                                   # open count: one worker per GPU
    (["parallel=fsdp"], 4),                                  # dp_shard=-1
    (["parallel=3d", "parallel.tp=2", "parallel.pp=1"], 4),  # dp_shard=-1
    (["parallel=fsdp", "parallel.dp_shard=2"], 2),           # the degrees fix it
    (["parallel=single"], 1),
    (["parallel=ddp", "device=cpu"], 2),                     # the CPU default is unchanged
])
def test_spawned_worker_count_defaults_to_the_gpu_count(composer, gpus, args, expected):
    gpus(4)
    cfg = composer(*args)
    assert world.world_size_for(cfg, strategy_class(cfg.parallel.name)) == expected


def test_refusal_exits_2_with_one_line_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, "parallel=ddp", "launcher.nproc_per_node=2"], run_dir, timeout=120,
                         module="tests.fixtures.fake_gpus", env={"FAKE_GPUS": "1"})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: launcher.nproc_per_node: 2 workers on this node but 1 visible GPU; set "
                     "launcher.nproc_per_node to at most 1 (one GPU per worker) or device=cpu"], proc.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())


# ---- 4. native bf16, asked of the worker's own GPU -----------------------------------------

def test_bf16_check_asks_the_local_gpu_without_emulation(composer, gpus, monkeypatch):
    gpus(8, name="Tesla V100-SXM2-16GB", major=7)
    asked = []

    class Guard:
        def __init__(self, index):
            asked.append(("device", index))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def is_bf16_supported(**kwargs):
        asked.append(kwargs)
        return kwargs.get("including_emulation", True)   # a V100: emulated bf16 only

    monkeypatch.setattr(torch.cuda, "device", Guard)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(ConfigError) as err:
        precision.validate_precision(composer("device=cuda", "precision=bf16"))
    assert asked == [("device", 3), {"including_emulation": False}]
    assert str(err.value) == ("precision: GPU 3 (Tesla V100-SXM2-16GB) cannot train in bfloat16 natively; "
                              "use precision=fp16 or fp32")


def test_bf16_on_an_ampere_gpu_passes(composer, gpus):
    gpus(1, name="NVIDIA A100-SXM4-80GB", major=8)
    precision.validate_precision(composer("device=cuda", "precision=bf16"))


def test_3d_runs_the_precision_check_too(tmp_path):
    """Before, parallel=3d skipped it: a V100 node would start 8 workers and train in emulated bf16."""
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, "parallel=3d", "precision=bf16", "launcher.nproc_per_node=8"], run_dir,
                         timeout=120, module="tests.fixtures.fake_gpus",
                         env={"FAKE_GPUS": "8", "FAKE_GPU_NAME": "Tesla V100-SXM2-16GB", "FAKE_GPU_MAJOR": "7"})
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "error: precision: GPU 0 (Tesla V100-SXM2-16GB) cannot train in bfloat16 natively; "
        "use precision=fp16 or fp32"], proc.stderr


# ---- 6. CPU threads per worker -------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_each_local_worker_gets_its_share_of_the_cores(composer, monkeypatch, tf32_flags, device):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    devices.prepare_worker(composer("parallel=ddp"), torch.device(device))
    assert set_to == [4]                   # 16 cores / 4 workers, whatever the device (torchrun says 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert devices.threads_per_worker(32) == 1


# ---- a parallel strategy alone: what a one-GPU machine now gets by default ---------------------

@pytest.mark.parametrize("args", [["parallel=ddp"], ["parallel=fsdp", "zero=stage3", "zero.offload_params=true"]],
                         ids=["ddp", "fsdp_offload"])
def test_a_parallel_strategy_runs_as_one_worker(tmp_path, reference_run, args):
    """One worker runs in this process, without a launcher: it still needs a process group (a world of one)."""
    assert_parity(train_run(tmp_path, "one", [*args, "launcher.nproc_per_node=1"]), reference_run())
