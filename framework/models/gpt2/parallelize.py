"""How GPT-2 is split across pipeline stages and sharded for tensor parallelism.

Tensor parallel (Megatron-style): q/k/v and the MLP's first linear are column-wise (weights and
biases sliced with the heads / hidden units), the attention output and the MLP's second linear
row-wise: their partial sums are reduced first and the (replicated) bias added once, after. The token
embedding is sharded over the vocabulary and so is the tied head, which is re-tied after sharding.
Position embeddings and LayerNorms are replicated. No sequence parallelism (the position embedding
would need its own sequence slice): the spec refuses it.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from framework.models.gpt2.model import GPT2
from framework.models.native_spec import stage_with_layers


def tensor_parallel_plan(model: GPT2, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """Module name -> style for the modules this (possibly pipeline-split) model holds (no sequence
    parallelism: the spec refuses it)."""
    plan: dict[str, ParallelStyle] = {}
    if model.wte is not None:
        plan["wte"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    for i in model.layers:
        block = f"layers.{i}"
        plan.update({
            f"{block}.attn.wq": ColwiseParallel(),
            f"{block}.attn.wk": ColwiseParallel(),
            f"{block}.attn.wv": ColwiseParallel(),
            f"{block}.attn.wo": RowwiseParallel(),
            f"{block}.mlp.fc": ColwiseParallel(),
            f"{block}.mlp.proj": RowwiseParallel(),
        })
    return plan


def pipeline_stage(model: GPT2, stage_index: int, num_stages: int) -> nn.Module:
    """A copy of `model` holding only stage `stage_index`'s layers (an equal share, in order), the
    embeddings on the first stage and ln_f + head on the last. Parameter names stay the full model's.
    A last stage without the embedding keeps lm_head.weight as its own parameter: the copy of the tied
    weight whose gradient the pipeline sums with the first stage's."""
    stage = stage_with_layers(model, stage_index, num_stages)
    if stage_index != 0:
        stage.wte = stage.wpe = None
    if stage_index != num_stages - 1:
        stage.ln_f = stage.lm_head = None
    return stage
