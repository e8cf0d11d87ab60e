"""How the MoE decoder is split across pipeline stages and sharded for tensor parallelism.

Attention takes Llama's Megatron-style plan; the MoE feed-forward is left whole on every tensor-parallel
rank (the router and experts see the replicated residual stream and compute the same on each), so
sequence parallelism, which would hand each rank other tokens, is refused by the spec. Experts are
spread over ranks by expert parallelism instead (framework/parallel/expert_parallel.py).
"""
from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from framework.models.llama.parallelize import pipeline_stage as llama_pipeline_stage


def tensor_parallel_plan(model: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "output": ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    }
    for i in model.layers:
        block = f"layers.{i}.attention"
        plan.update({f"{block}.wq": ColwiseParallel(), f"{block}.wk": ColwiseParallel(),
                     f"{block}.wv": ColwiseParallel(), f"{block}.wo": RowwiseParallel()})
    return plan


def pipeline_stage(model: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """Llama's split: an equal share of the layers, the embedding first, norm and head last."""
    return llama_pipeline_stage(model, stage_index, num_stages)
