"""Which scaled_dot_product_attention kernel a job's attention runs on a CUDA device, as far as the plan
needs it. Flash attention takes fp16/bf16 only; the memory-efficient kernel takes fp32 but, in torch's
SDPA, not grouped-query attention (`enable_gqa`: flash and math only). What is left is the math kernel,
which computes and keeps the s x s scores in fp32: an fp32 Llama with fewer key/value heads than query
heads pays that on a GPU (the 870M fp32 job of docs/benchmarks/h100.md died of it at 75 GiB). On the CPU the
fused kernel serves every dtype, so the plan of a CPU job traces the fused kernel."""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.config.schema import Config

FUSED, MATH = "fused", "math"


def on_gpu(cfg: Config) -> str:
    """FUSED or MATH for the job's attention on a CUDA device."""
    if cfg.precision.name != "fp32":
        return FUSED
    m = cfg.model
    heads = m.get("n_heads") or m.get("num_attention_heads")
    kv_heads = m.get("n_kv_heads") or m.get("num_key_value_heads") or heads
    return MATH if heads and kv_heads != heads else FUSED


def tracing(kernel: str):
    """A context in which SDPA dispatches to `kernel` (FakeTensor traces on the CPU)."""
    if kernel == FUSED:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)
