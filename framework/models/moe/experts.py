"""Expert computation: SwiGLU for tokens already sorted by expert, as one grouped GEMM per weight
(`torch._grouped_mm`, on CUDA and, in torch 2.13, on CPU in fp32) or as a loop over experts. Both give
the same numbers; `auto` takes the grouped GEMM wherever torch has it and the sizes meet its 16-byte
row alignment."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: torch._grouped_mm's backward
    refuses the stride-0 gradients that e.g. a .sum() hands back."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm")


def _aligned(*weights: torch.Tensor) -> bool:
    """grouped_mm needs every row stride a multiple of 16 bytes (dim and hidden size alike)."""
    return all(w.shape[-1] * w.element_size() % 16 == 0 and w.shape[-2] * w.element_size() % 16 == 0
               for w in weights)


def _grouped_here(x: torch.Tensor, w: torch.Tensor) -> bool:
    """CUDA's grouped_mm takes bf16 only; torch 2.13's CPU kernel takes fp32 too (eagerly: its meta kernel,
    which a compiled block traces through, takes bf16 only)."""
    return w.dtype == torch.bfloat16 or x.device.type == "cpu"


def _grouped(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (tokens, in) @ w[e].T for each expert's rows: w (E, out, in)."""
    return _ContiguousGrad.apply(torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets))


def _grouped_traceable(w1: torch.Tensor, w2: torch.Tensor, compute: str) -> bool:
    """Whether a compiled block can trace the experts as one graph: the grouped GEMM, whose shapes do not
    depend on the routing (the loop splits by counts, data a graph would specialize on: a recompile for
    every new routing until dynamo's cache limit)."""
    return compute != "loop" and has_grouped_mm() and w1.dtype == torch.bfloat16 and _aligned(w1, w2)


def expert_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor,
                  compute: str = "auto") -> torch.Tensor:
    """x (tokens sorted by expert, dim), counts (E,) -> w2[e] (silu(w1[e] x) * w3[e] x) for each row's expert."""
    if torch.compiler.is_compiling() and not _grouped_traceable(w1, w2, compute):
        return _in_eager(x, counts, w1, w3, w2, compute)
    if is_fake(x):
        # the planner's pass over fake tensors: the same shapes and dtypes, without splitting by counts
        # (data it does not have) or grouped_mm (whose meta kernel takes bf16 only)
        return F.linear(F.silu(F.linear(x, w1[0])) * F.linear(x, w3[0]), w2[0])
    if compute == "grouped_mm" or (compute == "auto" and has_grouped_mm() and _aligned(w1, w2)
                                   and _grouped_here(x, w1)):
        # grouped_mm wants the weights and rows in one dtype and 32-bit cumulative row offsets
        offsets = counts.cumsum(0).to(torch.int32)
        xw = x.to(w1.dtype)
        hidden = F.silu(_grouped(xw, w1, offsets)) * _grouped(xw, w3, offsets)
        return _grouped(hidden, w2, offsets)
    outs = []
    # rows in the weights' dtype: FSDP's bf16 policy leaves expert-parallel experts (not its own) in fp32
    for e, rows in enumerate(x.to(w1.dtype).split(counts.tolist())):
        outs.append(F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e]))
    return torch.cat(outs)


#: the experts outside the compiled graph, run eagerly where the routing decides shapes (one graph break)
_in_eager = torch.compiler.disable(expert_swiglu)
