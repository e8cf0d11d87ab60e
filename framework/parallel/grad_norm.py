"""One gradient-norm clipping for every torch-native layout: plain tensors, DTensor shards (tp, dp)
and pipeline stages held by other ranks."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.nn.Parameter], max_norm: float, device: torch.device,
                    stage_group: Optional[ProcessGroup] = None,
                    counted: Optional[Iterable[torch.nn.Parameter]] = None) -> torch.Tensor:
    """The 2-norm over the whole model's gradients; scale them to at most max_norm (0 = measure only).

    DTensor gradients are grouped by (mesh, placements, device) and measured on their local shards: the
    squares of a group's shards are summed over the mesh dims it is sharded on, one all-reduce a dim.
    DTensor's own dispatch would give the same numbers, but its first sharding propagation for a foreach op
    on a 2-D mesh costs about 10 ms a tensor, paid again by every new process. stage_group sums the squares
    of the other pipeline stages. counted: the parameters the norm is taken over when not all of them (a
    tied parameter's second copy is left out of the norm but scaled like the rest)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    measured = grads if counted is None else [p.grad for p in counted if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for (layout, _), group in _by_kind(measured).items():
        squares += _squares(group, layout, device)
    if stage_group is not None:
        dist.all_reduce(squares, group=stage_group)
    total = squares.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)    # stays a tensor: no wait for the device
        # One multi-tensor op per kind of gradient (torch's clip does the same), not one op per parameter
        # (each GPU op is a kernel launch); on the local shards, as the norm is taken.
        for (_, where), same in _by_kind(grads).items():
            torch._foreach_mul_([_local(g) for g in same], coef if where == coef.device else coef.to(where))
    return total


def _squares(grads: list[torch.Tensor], layout, device: torch.device) -> torch.Tensor:
    """The sum of squares of `grads`, all of one `layout` (None, or a DTensor's mesh and placements)."""
    if layout is not None and any(p.is_partial() for p in layout[1]):
        # a pending reduction: the norm of the sum is not the sum of the shards' norms
        return torch.nn.utils.get_total_norm(grads).full_tensor().float().to(device) ** 2
    # on `device` before any all-reduce: an offloaded shard's norm is on the CPU
    local = _fp32_norm([_local(g) for g in grads]).to(device) ** 2
    if layout is not None:
        mesh, placements = layout
        for dim in sharded_dims(placements):
            dist.all_reduce(local, group=mesh.get_group(dim))
    return local


def _fp32_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of plain tensors, in fp32. bf16 gradients (precision.store_dtype=bfloat16) are measured in fp32
    tensor by tensor: torch's total norm would round each tensor's norm, and the total, to bf16."""
    if all(g.dtype == torch.float32 for g in grads):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]))


def sharded_dims(placements) -> list[int]:
    """The mesh dims whose ranks hold different pieces of a (not partial) DTensor: every dim not replicated.
    FSDP2 over tp shards with _StridedShard, which is not `is_shard()`."""
    return [dim for dim, placement in enumerate(placements) if not placement.is_replicate()]


def _local(g: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the same storage, so scaling it scales the gradient), else the tensor."""
    return g.to_local() if isinstance(g, DTensor) else g


def _by_kind(grads: list[torch.Tensor]) -> dict:
    """(mesh and placements, or None for plain tensors; device) -> gradients: a foreach op takes one kind."""
    out: dict = {}
    for g in grads:
        layout = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        out.setdefault((layout, g.device), []).append(g)
    return out
