"""The operator trace behind the planner's GPU step time (framework/plan/op_costs.py, gpu_time.py) and its
activation trace (activations.py): the short cuts they take give what the long way gives. Fake tensors
only: no process, no arithmetic."""
import pytest
import torch

from framework.plan import activations, attention_kernel, few_blocks, gpu_time, op_costs
from framework.plan.layout import Casting
from tests.integration.plan.test_plan import config

H100 = dict(peak=989e12, attention_peak=989e12, hbm=3.35e12, seq_len=256)
LLAMA = ("model=llama_125m", "model.dim=128", "model.n_layers=8", "model.n_heads=4", "model.n_kv_heads=2",
         "model.vocab_size=512", "data=synthetic", "data.vocab_size=512", "data.seq_len=256", "precision=bf16")


def _flops(costs, part):
    return sum(2 * m * n * k * count for (m, n, k, _), count in costs.matmuls.get(part, {}).items())


@pytest.mark.parametrize("extra", [[], ["activation_checkpointing=full"], ["activation_checkpointing=selective"]],
                         ids=["none", "full", "layer"])
def test_two_and_three_traced_blocks_give_what_every_block_costs(extra):
    cfg = config(*LLAMA, *extra)
    few = op_costs._trace_few_blocks(cfg, 1, 256, attention_kernel.FUSED)
    every = op_costs._trace(cfg, 1, 256, attention_kernel.FUSED)
    assert _flops(few, "block") == pytest.approx(_flops(every, "block"), rel=1e-9)
    for table in ("attention_flops", "memory_bytes", "fused_bytes", "kernels"):
        assert getattr(few, table)["block"] == pytest.approx(getattr(every, table)["block"], rel=1e-9), table
    assert few.memory_bytes["rest"] == every.memory_bytes["rest"]


@pytest.mark.parametrize("extra", [[], ["activation_checkpointing=full"], ["activation_checkpointing=selective"],
                                   ["activation_checkpointing=selective", "activation_checkpointing.mode=op"]],
                         ids=["none", "full", "layer", "op"])
def test_three_traced_periods_of_blocks_give_the_whole_models_activations(extra, monkeypatch):
    cfg = config(*LLAMA, *extra)
    for casting in (Casting(), Casting(weights=True, autocast=False)):
        few = activations.measure(cfg, 1, 256, casting=casting)
        with monkeypatch.context() as m:
            m.setattr(few_blocks, "shortened", lambda *_: None)
            m.setattr(activations, "_CACHE", {})
            whole = activations.measure(cfg, 1, 256, casting=casting)
        assert len(few.blocks) == len(whole.blocks) == cfg.model.n_layers
        for profile in ("blocks", "head", "tail", "block_full", "block_largest"):
            assert getattr(few, profile) == getattr(whole, profile), profile
        assert few.compiled.blocks == whole.compiled.blocks


@pytest.mark.parametrize("compiled", [False, True])
def test_a_micro_batch_costs_what_the_traces_of_one_and_two_sequences_extrapolate_to(compiled):
    cfg = config(*LLAMA)
    traced = op_costs.traced_per_sequence(cfg, 256)
    direct = op_costs.traced(cfg, 4, 256)
    for part in ("block", "rest"):
        predicted = gpu_time.part_time(traced, part, 4, compiled=compiled, **H100)
        measured = gpu_time._part_time(direct, part, compiled=compiled, **H100)
        assert predicted.total == pytest.approx(measured.total, rel=0.01), part


def test_a_compiled_block_moves_less_than_an_eager_one_and_the_same_matmuls():
    costs = op_costs.traced(config(*LLAMA), 1, 256)
    assert costs.fused_bytes["block"] < 0.5 * costs.memory_bytes["block"]
    assert costs.fused_kernels["block"] < costs.kernels["block"]


def test_a_fused_output_that_matmuls_read_is_written_once_and_its_intermediates_never():
    # relu(x * 2) fused: x is read, x * 2 stays in the fusion, and the result is written once for the two
    # matmuls that read it (their own reads are the matmuls' cost)
    costs = op_costs.OpCosts()
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    with op_costs._Recorder(costs, in_block=lambda: True, phase=lambda: ("forward", 1)):
        y = (x * 2).relu()
        y @ w
        y.t() @ y
    assert costs.fused_bytes["block"] == x.nbytes + y.nbytes
    assert costs.memory_bytes["block"] == 2 * x.nbytes + 2 * y.nbytes


def test_fp32_grouped_query_attention_plans_the_math_kernel_on_a_gpu():
    assert attention_kernel.on_gpu(config(*LLAMA)) == attention_kernel.FUSED                       # bf16: flash
    assert attention_kernel.on_gpu(config(*LLAMA, "precision=fp32")) == attention_kernel.MATH       # fp32 + GQA
    assert attention_kernel.on_gpu(config(*LLAMA, "precision=fp32", "model.n_kv_heads=4")) == attention_kernel.FUSED
    # the math kernel materialises the s x s scores: its matmuls appear, the fused kernel's FLOPs go
    cfg = config(*LLAMA, "precision=fp32")
    math = op_costs.traced(cfg, 1, 256, attention_kernel.MATH)
    fused = op_costs.traced(cfg, 1, 256, attention_kernel.FUSED)
    assert not math.attention_flops.get("block") and fused.attention_flops["block"] > 0
    assert _flops(math, "block") > _flops(fused, "block")
