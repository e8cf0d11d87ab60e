"""LoRA's adapted linear against PEFT's, layer by layer: the same output and gradients on every stored base
(float32, bfloat16, NF4, float8) with and without DoRA, a bias, a scaling that is not a power of two, and
under bf16 autocast; no elementwise pass over the layer's output beyond the base linear's own; and
benchmarks/lora_vs_peft.py, whose two LoRA sides must train the same losses, runs."""
import subprocess
import sys

import pytest
import torch
from torch import nn

from framework.models import lora
from tests.harness.helpers import REPO

peft = pytest.importorskip("peft")

IN, OUT = 24, 40         # unequal, so that a pass over the output is told from one over the input


def _pair(rank: int, alpha: float, bias: bool, dora: bool = False, base_dtype: str = "float32"):
    """(ours, peft's) on the same base linear and the same adapters: ours stores its frozen weight in `base_dtype`,
    peft's nn.Linear holds the values it stands for."""
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(IN, OUT, bias=bias))
    lora.apply_lora(ours, ["0"], rank, alpha, dora=dora)
    layer = ours[0]
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if lora.is_adapter(name):
                lora.init_adapter(name, p, seed=0, base=layer.weight)
        layer.lora_B.normal_()             # a trained adapter: B is no longer zero
    lora.store_base(ours, base_dtype)
    base = nn.Sequential(nn.Linear(IN, OUT, bias=bias))
    with torch.no_grad():
        base[0].weight.copy_(lora.dequantized(layer.weight, torch.float32))
        if bias:
            base[0].bias.copy_(layer.bias)
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=["0"], use_dora=dora))
    adapted = theirs.base_model.model[0]
    with torch.no_grad():
        adapted.lora_A["default"].weight.copy_(layer.lora_A)
        adapted.lora_B["default"].weight.copy_(layer.lora_B)
        if dora:
            adapted.lora_magnitude_vector["default"].weight.copy_(layer.lora_magnitude)
    return ours, theirs


def _adapters(model) -> list[torch.Tensor]:
    """The adapters' gradients in lora_A, lora_B(, magnitude) order, whichever side's layout."""
    named = dict(model.named_parameters())
    return [next(p.grad for n, p in named.items() if key in n and p.requires_grad)
            for key in ("lora_A", "lora_B", "magnitude") if any(key in n for n in named)]


def _step(model, x: torch.Tensor, grad: torch.Tensor, autocast: bool) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = model(x)
    y.float().backward(grad)
    return [t.detach() for t in (y, x.grad, *_adapters(model))]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("base_dtype", lora.BASE_DTYPES)
@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("rank,alpha,bias", [(8, 16.0, False), (6, 16.0, True)], ids=["x2", "x8/3+bias"])
def test_the_adapted_linear_computes_what_peft_computes(base_dtype, dora, rank, alpha, bias):
    if base_dtype in ("float8", "nf4"):
        pytest.importorskip("torchao")
    ours, theirs = _pair(rank, alpha, bias, dora, base_dtype)
    x, grad = torch.randn(3, 5, IN), torch.randn(3, 5, OUT)
    got, want = _step(ours, x, grad, False), _step(theirs, x, grad, False)
    assert len(got) == len(want) == (5 if dora else 4)
    for name, a, b in zip(("output", "input grad", "lora_A grad", "lora_B grad", "magnitude grad"), got, want):
        assert _relative(a, b) <= 1e-6, name


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_under_bf16_autocast_the_adapted_linear_is_peft_up_to_bf16_rounding(dora):
    """PEFT rounds the adapter's product to bf16 before adding it to the base output, the fused GEMM once after:
    one bf16 rounding apart (2^-8 relative), no more. The bias is the base linear's, so the output stays in bf16."""
    ours, theirs = _pair(8, 16.0, True, dora)
    x, grad = torch.randn(3, 5, IN), torch.randn(3, 5, OUT)
    got, want = _step(ours, x, grad, True), _step(theirs, x, grad, True)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    for name, a, b in zip(("output", "input grad", "lora_A grad", "lora_B grad", "magnitude grad"), got, want):
        assert _relative(a, b) <= 2 ** -6, name


def _passes_over_the_output(model) -> list[str]:
    """The elementwise ops (mul, add, ...) of one forward and backward that read or write a tensor of the
    layer's output shape: work on top of the base linear's, which needs none."""
    x = torch.randn(3, 5, IN, requires_grad=True)      # a block's input: its gradient is wanted too
    with torch.profiler.profile(record_shapes=True) as prof:
        model(x).backward(torch.randn(3, 5, OUT))
    shapes = ([3, 5, OUT], [15, OUT])
    return [e.name for e in prof.events()
            if e.name in ("aten::mul", "aten::add", "aten::mul_", "aten::add_", "aten::div", "aten::sub")
            and any(list(s) in shapes for s in e.input_shapes if s)]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_adapter_adds_its_scaled_product_inside_its_second_gemm(bias):
    """PEFT (and this layer before) scaled the adapter's product and added it to the base output as two more
    passes over the output, and scaled the output's gradient in a third: on a 64-wide model at rank 16 as much
    CPU time as the adapter's GEMMs. addmm's alpha and added input do both inside the GEMM."""
    ours, theirs = _pair(8, 16.0, bias)
    assert _passes_over_the_output(ours) == []
    assert len(_passes_over_the_output(theirs)) >= 3          # what the check would see: PEFT's mul, add, mul


def test_the_lora_benchmark_runs_and_its_two_lora_sides_train_the_same_losses():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lora_vs_peft.py"), "--smoke"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "framework LoRA / PEFT" in proc.stdout and "LoRA losses equal to" in proc.stdout
