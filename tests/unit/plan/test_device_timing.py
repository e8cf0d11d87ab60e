"""The planner timing the job's own model on this host's GPU (framework/plan/device_timing.py), checked here
with the CPU as the device and the clock replaced where a number must be exact."""
import pytest
import torch

from framework.plan import device_timing
from framework.plan.layout import Casting
from tests.integration.plan.test_plan import config

LLAMA = ("model=llama_125m", "model.dim=64", "model.n_layers=8", "model.n_heads=2", "model.n_kv_heads=1",
         "model.vocab_size=256", "data=synthetic", "data.vocab_size=256", "data.seq_len=32", "precision=bf16")


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(device_timing, "_CACHE", {})


def test_two_and_three_timed_periods_extend_to_the_whole_model(monkeypatch):
    # a model of n blocks that costs 0.1 s + 0.02 s a block, and steps in 0.01 s + 0.003 s a block
    def seconds(cfg, micro_batch, seq_len, casting, device):
        n = cfg.model.n_layers
        return 0.1 + 0.02 * n, 0.01 + 0.003 * n
    monkeypatch.setattr(device_timing, "_seconds", seconds)
    for extra, period in (([], 1), (["activation_checkpointing=selective", "activation_checkpointing.every_n_layers=2"], 2)):
        monkeypatch.setattr(device_timing, "_CACHE", {})
        timing = device_timing.timed_on_device(config(*LLAMA, *extra), 1, 32, Casting(), "cpu")
        assert timing.block_s == pytest.approx(0.02 * 8), period
        assert timing.rest_s == pytest.approx(0.1)
        assert timing.optimizer_s == pytest.approx(0.01 + 0.003 * 8)


def test_the_timed_model_is_the_jobs_in_the_dtype_its_wrapper_computes_in(monkeypatch):
    seen = []

    def time_steps(model, optimizer, tokens, repeats, autocast, sync):
        with autocast():
            autocasting = torch.is_autocast_enabled("cpu")
        seen.append(({p.dtype for p in model.parameters()}, autocasting, tuple(tokens.shape),
                     len(model.layers)))
        return 0.5, 0.1
    monkeypatch.setattr(device_timing, "time_steps", time_steps)
    cfg = config(*LLAMA)
    device_timing.timed_on_device(cfg, 2, 32, Casting(), "cpu")                       # single, ddp
    device_timing.timed_on_device(cfg, 2, 32, Casting(weights=True, autocast=False), "cpu")   # FSDP2, DeepSpeed
    assert seen == [({torch.float32}, True, (2, 33), 2), ({torch.float32}, True, (2, 33), 3),
                    ({torch.bfloat16}, False, (2, 33), 2), ({torch.bfloat16}, False, (2, 33), 3)]


def test_a_model_timed_on_the_cpu_gives_a_step_time():
    # (how it splits between blocks and the rest is the clock's: a busy CPU may time 3 blocks as fast as 2)
    timing = device_timing.timed_on_device(config(*LLAMA, "activation_checkpointing=full"), 1, 32, Casting(), "cpu")
    assert timing.block_s + timing.rest_s > 0 and timing.optimizer_s > 0
    assert timing.block_s >= 0 and timing.rest_s >= 0


def test_a_model_that_cannot_run_there_is_modelled_instead(monkeypatch, caplog):
    def seconds(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(device_timing, "_seconds", seconds)
    assert device_timing.timed_on_device(config(*LLAMA), 1, 32, Casting(), "cpu") is None
    assert "cannot be timed on cpu (CUDA out of memory" in caplog.text
