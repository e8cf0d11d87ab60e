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

    DTensor gradients are grouped by (mesh, placements, device): get_total_norm over one group gives a DTensor
    whose full_tensor() reduces the shards. stage_group sums the squares of the other pipeline stages.
    counted: the parameters the norm is taken over when not all of them (a tied parameter's second copy
    is left out of the norm but scaled like the rest)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    measured = grads if counted is None else [p.grad for p in counted if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for group in _by_kind(measured).values():
        norm = torch.nn.utils.get_total_norm(group)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares += norm.float().to(device) ** 2   # offloaded shards' norm is on the CPU
    if stage_group is not None:
        dist.all_reduce(squares, group=stage_group)
    total = squares.sqrt()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)    # stays a tensor: no wait for the device
        # One multi-tensor op per kind of gradient (torch's clip does the same), not one op per parameter:
        # each DTensor op pays sharding propagation, each GPU op a kernel launch.
        for (_, where), same in _by_kind(grads).items():
            torch._foreach_mul_(same, coef if where == coef.device else coef.to(where))
    return total


def _by_kind(grads: list[torch.Tensor]) -> dict:
    """(mesh and placements, or None for plain tensors; device) -> gradients: a foreach op takes one kind."""
    out: dict = {}
    for g in grads:
        layout = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        out.setdefault((layout, g.device), []).append(g)
    return out
