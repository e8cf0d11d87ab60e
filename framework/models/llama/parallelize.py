"""How Llama is split across pipeline stages and sharded for tensor parallelism.

Tensor parallel (Megatron-style): q/k/v and the MLP gate/up are column-wise (each rank owns a
slice of the heads / hidden units), the attention output and MLP down projection row-wise (their
partial sums are reduced once per sub-block). The embedding is sharded over the vocabulary and the
output head over its columns, gathered back to full logits for the loss.

With sequence parallelism the activations between those regions (norms, residual adds) stay
sharded along the sequence: all-gather before attention/MLP, reduce-scatter after, instead of
all-reduce. Activations crossing a pipeline stage boundary are then each rank's sequence shard.

A feed-forward other than the SwiGLU MLP (a variant's mixture of experts) is left whole on every rank:
it sees the replicated residual stream and computes the same on each (its spec refuses sequence
parallelism, which would hand each rank other tokens; experts spread by expert parallelism instead).
"""
from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)

from framework.models.llama.model import FeedForward, Llama
from framework.models.native_spec import stage_with_layers


def tensor_parallel_plan(model: Llama, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Module name -> style for the modules this (possibly pipeline-split) model holds."""
    between = Shard(1) if sequence_parallel else Replicate()   # layout of the residual stream
    plan: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "output": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for i, layer in model.layers.items():
        block = f"layers.{i}"
        plan.update({
            f"{block}.attention.wq": ColwiseParallel(),
            f"{block}.attention.wk": ColwiseParallel(),
            f"{block}.attention.wv": ColwiseParallel(),
            f"{block}.attention.wo": RowwiseParallel(output_layouts=between),
        })
        if isinstance(layer.feed_forward, FeedForward):
            plan.update({
                f"{block}.feed_forward.w1": ColwiseParallel(),
                f"{block}.feed_forward.w3": ColwiseParallel(),
                f"{block}.feed_forward.w2": RowwiseParallel(output_layouts=between),
            })
        if sequence_parallel:
            plan.update({
                f"{block}.attention_norm": SequenceParallel(),
                f"{block}.ffn_norm": SequenceParallel(),
                # Attention also takes the rotary tables and the packed documents' mask (or None): plain,
                # the same on every rank.
                f"{block}.attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                                         desired_input_layouts=(Replicate(), None, None, None),
                                                         use_local_output=True),
                f"{block}.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                            desired_input_layouts=(Replicate(),),
                                                            use_local_output=True),
            })
    return plan


def pipeline_stage(model: Llama, stage_index: int, num_stages: int) -> nn.Module:
    """A copy of `model` holding only stage `stage_index`'s layers (an equal share, in order), the
    embedding on the first stage and norm + head on the last. Parameter names stay those of the full
    model, so per-name seeded init and checkpoints agree with a single-process run."""
    stage = stage_with_layers(model, stage_index, num_stages)
    if stage_index != 0:
        stage.tok_embeddings = None
    if stage_index != num_stages - 1:
        stage.norm = None
        stage.output = None
    return stage
