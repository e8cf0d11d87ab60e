"""Expert parallelism: each MoE layer's experts sharded over the data-parallel ranks, tokens sent to the
rank holding their expert and brought back with all-to-all (gloo and NCCL alike).

A layer's 3-D expert weights (expert, out, in) become DTensors sharded on dim 0 over the flattened
data-parallel mesh, so per-name init, checkpoints (DCP) and resharding see the full tensors. FSDP leaves
them out (each rank holds its experts whole). Dispatch, per layer, after the router sorted the local
(token, choice) rows by expert id:
  1. all-to-all of the per-expert counts: how many rows each rank sends me for each of my experts;
  2. all-to-all of the rows (uneven splits), then a permutation from (source rank, expert) order to
     (expert, source rank) order, so each local expert's rows are contiguous for one grouped GEMM;
  3. the inverse permutation and all-to-all back, in the router's order.
Both all-to-alls are autograd functions whose backward is the reverse exchange. An expert's gradient
sums the losses of every rank that sent it tokens; dividing it by the data-parallel degree gives the
data-parallel mean that FSDP gives the other parameters. Under context parallelism each cp rank of a data
rank holds a copy of the same experts and routes its own share of the sequences: each micro-batch's
expert gradient is then also summed over the cp group (and divided by cp), as FSDP averages the others
over dp x cp.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from framework.models.moe.experts import expert_swiglu


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


class _ExpertGrad(torch.autograd.Function):
    """Identity; the backward scales the gradient by `factor` after summing it over `replicas` (if any)."""

    @staticmethod
    def forward(ctx, x, factor: float, replicas):
        ctx.factor, ctx.replicas = factor, replicas
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.replicas is not None:
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.replicas)
        return grad * ctx.factor, None, None


class AllToAllDispatcher:
    """Called by an MoE layer as dispatcher(rows sorted by expert, counts (E,), experts module)."""

    def __init__(self, mesh: DeviceMesh, replicas: DeviceMesh | None = None):
        self.group = mesh.get_group()
        self.size = mesh.size()
        self.replicas = replicas.get_group() if replicas is not None and replicas.size() > 1 else None
        self.copies = replicas.size() if self.replicas is not None else 1

    @torch.compiler.disable
    def __call__(self, routed: torch.Tensor, counts: torch.Tensor, experts: nn.Module) -> torch.Tensor:
        """Eager inside a compiled block: every split here is set by the routing, which a graph would specialize
        on (a recompile per routing pattern until dynamo's cache limit)."""
        ranks = self.size
        mine = counts.numel() // ranks                          # experts per rank
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        send_counts = counts.view(ranks, mine)
        recv_counts = recv_counts.view(ranks, mine)             # [source rank, my expert]
        send = send_counts.sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        rows = _AllToAll.apply(routed, send, recv, self.group)
        # (source, expert) chunks -> (expert, source) chunks
        chunk_sizes = recv_counts.flatten().tolist()
        chunk_order = torch.arange(ranks * mine).view(ranks, mine).t().flatten().tolist()
        chunks = rows.split(chunk_sizes)
        by_expert = torch.cat([chunks[i] for i in chunk_order]) if chunks else rows
        scale = 1.0 / (ranks * self.copies)
        weights = [_ExpertGrad.apply(w.to_local(), scale, self.replicas) for w in (experts.w1, experts.w3, experts.w2)]
        out = expert_swiglu(by_expert, recv_counts.sum(0), *weights, experts.compute)
        back_chunks = out.split([chunk_sizes[i] for i in chunk_order])
        inverse = [0] * len(chunk_order)
        for position, i in enumerate(chunk_order):
            inverse[i] = position
        by_source = torch.cat([back_chunks[inverse[i]] for i in range(len(chunk_order))])
        return _AllToAll.apply(by_source, recv, send, self.group)


def expert_layers(module: nn.Module) -> list[nn.Module]:
    """The MoE layers of `module`: those with an `experts` child and a `dispatcher` slot."""
    return [m for m in module.modules() if hasattr(m, "dispatcher") and hasattr(m, "experts")]


def apply_expert_parallel(module: nn.Module, mesh: DeviceMesh, replicas: DeviceMesh | None = None) -> set[nn.Parameter]:
    """Shard every MoE layer's experts over `mesh` (dim 0) and route its tokens by all-to-all (`replicas`:
    the ranks holding copies of the same shard, the cp group); returns the expert parameters, which FSDP
    must leave alone."""
    sharded: set[nn.Parameter] = set()
    for layer in expert_layers(module):
        experts = layer.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            local = param.data.chunk(mesh.size())[mesh.get_local_rank()]     # meta on a skeleton: no data
            dparam = nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False),
                                  requires_grad=param.requires_grad)
            setattr(experts, name, dparam)
            sharded.add(dparam)
        layer.dispatcher = AllToAllDispatcher(mesh, replicas)
    return sharded
