"""Seconds a GPU spends on one rank's share of a step, from the operators the job runs (op_costs):
matmuls at a share of the dtype's dense peak (or at memory speed where a shape is too thin to be
compute-bound), attention kernels at a smaller share, every other operator at memory bandwidth, plus a
gap per kernel launch that eager pays for each operator and a compiled block pays once per fused group.
The optimizer step and gradient clipping run at memory bandwidth over the rank's own states.

The shares are what H100-class parts reach on transformer shapes, from public kernel benchmarks, and
were checked (not fitted one by one) against every measured row of docs/benchmarks/h100.md
(tests/integration/plan/test_plan_gpu.py):
- cuBLAS bf16/fp16 and TF32 GEMMs with k >= 2048 reach ~70% of the dense peak (NVIDIA's H100 GEMM
  figures: ~650-750 of 989 TFLOP/s);
- FlashAttention-2 through SDPA at the rate the FlashAttention-3 paper (Shah et al., 2024, figures 5-6:
  H100 80GB SXM5, head dim 128) measured it by sequence length, forward (causal) and backward together:
  21% of the dense peak at 512 tokens, 30% at 2,048, 33% at 8,192;
- element-wise and reduction kernels ~80% of HBM bandwidth (STREAM-like copies on an H100 SXM: ~2.7-3.0
  of 3.35 TB/s);
- ~3 us between two kernels a Python loop launches back to back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from framework.plan.op_costs import OpCosts, Traced

MATMUL_SHARE = 0.70
BANDWIDTH_SHARE = 0.80
KERNEL_GAP_S = 3e-6
# FlashAttention-2 on an H100 SXM5 (989 dense TFLOP/s), TFLOP/s by sequence length: (forward with the causal
# mask, backward); the paper's backward figure is without the mask, which makes it an upper bound
FA2_H100_TFLOPS = {512: (191, 214), 1024: (260, 260), 2048: (298, 291), 4096: (319, 310), 8192: (333, 318),
                   16384: (335, 322)}
FA2_MEASURED_PEAK = 989e12


def attention_share(seq_len: int) -> float:
    """The share of the dense peak attention's forward and backward (2.5x its FLOPs) reach together at this
    sequence length, interpolated in log2(length) between the measured lengths and held at either end."""
    def share(fwd: float, bwd: float) -> float:
        return 3.5 / (1 / fwd + 2.5 / bwd) * 1e12 / FA2_MEASURED_PEAK
    lengths = sorted(FA2_H100_TFLOPS)
    seq = min(max(seq_len, lengths[0]), lengths[-1])
    upper = next(n for n in lengths if n >= seq)
    lower = max(n for n in lengths if n <= seq)
    if upper == lower:
        return share(*FA2_H100_TFLOPS[seq])
    t = (math.log2(seq) - math.log2(lower)) / (math.log2(upper) - math.log2(lower))
    return (1 - t) * share(*FA2_H100_TFLOPS[lower]) + t * share(*FA2_H100_TFLOPS[upper])


@dataclass(frozen=True)
class PartTime:
    matmul: float
    attention: float
    memory: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.memory


def _matmul_s(shapes: dict, peak: float, hbm: float) -> float:
    seconds = 0.0
    for (m, n, k, elem), count in shapes.items():
        flops = 2.0 * m * n * k
        moved = (m * k + k * n + m * n) * elem
        seconds += count * max(flops / (peak * MATMUL_SHARE), moved / (hbm * BANDWIDTH_SHARE))
    return seconds


def _part_time(costs: OpCosts, part: str, peak: float, attention_peak: float, hbm: float, compiled: bool,
               seq_len: int) -> PartTime:
    fused = compiled and part == "block"
    moved = (costs.fused_bytes if fused else costs.memory_bytes).get(part, 0)
    kernels = (costs.fused_kernels if fused else costs.kernels).get(part, 0)
    return PartTime(matmul=_matmul_s(costs.matmuls.get(part, {}), peak, hbm),
                    attention=costs.attention_flops.get(part, 0) / (attention_peak * attention_share(seq_len)),
                    memory=moved / (hbm * BANDWIDTH_SHARE) + kernels * KERNEL_GAP_S)


def part_time(traced: Traced, part: str, sequences: int, peak: float, attention_peak: float, hbm: float,
              compiled: bool, seq_len: int) -> PartTime:
    """Seconds of one micro-batch of `sequences` in `part` ("block": all blocks; "rest": embedding, head,
    loss) of `seq_len` tokens (each attention kernel's length): what one sequence costs, and what each further
    one adds (the traces of one and two)."""
    one = _part_time(traced.one, part, peak, attention_peak, hbm, compiled, seq_len)
    grown = sequences - 1
    if not grown:
        return one
    two = _part_time(traced.two, part, peak, attention_peak, hbm, compiled, seq_len)
    return PartTime(matmul=one.matmul + grown * (two.matmul - one.matmul),
                    attention=one.attention + grown * (two.attention - one.attention),
                    memory=one.memory + grown * (two.memory - one.memory))


def optimizer_step_s(param_bytes: int, grad_bytes: int, state_bytes: int, master_bytes: int, hbm: float) -> float:
    """A fused/foreach optimizer step with clipping: the gradients are read for their norm and scaled,
    then parameters, gradients and states read and parameters and states written once."""
    moved = 3 * grad_bytes + 2 * (param_bytes + state_bytes + master_bytes)
    return moved / (hbm * BANDWIDTH_SHARE)
