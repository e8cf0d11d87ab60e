"""One parameter used in two places (an output head tied to the token embedding) when pipeline stages
hold the two places apart, as Megatron does it: the first stage owns the parameter, the last stage a
copy of it (same name -> same init, see ModelSpec.tied_parameters); after each backward the copies'
gradients are summed over the pipeline group, so both take the same optimizer step and stay equal, and
the gradient norm counts the parameter once (the canonical copy).

Ranks holding no copy add zeros of the copies' local shape (learned once at set-up): one all-reduce over
the pipeline group instead of a group of its own per (dp, tp) coordinate.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class TiedAcrossStages:
    def __init__(self, stages: list[nn.Module], pairs: Iterable[tuple[str, str]], group, device: torch.device):
        self.stages, self.group, self.device = stages, group, device
        self.pairs = tuple(pairs)
        self.aliases = {alias for _, alias in self.pairs}
        self.shapes = []
        for pair in self.pairs:
            mine = self._copies(pair)
            shapes: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(shapes, tuple(_local(mine[0]).shape) if mine else None, group=group)
            self.shapes.append(next(s for s in shapes if s is not None))

    def _copies(self, pair: tuple[str, str]) -> list[nn.Parameter]:
        return [p for stage in self.stages for name, p in stage.named_parameters() if name in pair]

    @torch.no_grad()
    def sum_grads(self) -> None:
        for pair, shape in zip(self.pairs, self.shapes):
            copies = [p for p in self._copies(pair) if p.grad is not None]
            for p in copies:
                # a sharded embedding's gradient may come back in another layout (e.g. replicated)
                if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
            grads = [_local(p.grad) for p in copies]
            total = torch.zeros(shape, dtype=torch.float32, device=self.device)
            for g in grads:
                total += g.to(total.device, torch.float32)
            dist.all_reduce(total, group=self.group)
            for g in grads:
                g.copy_(total)

    def counted(self) -> Iterator[nn.Parameter]:
        """Every parameter the gradient norm counts: each tied one once."""
        for stage in self.stages:
            for name, p in stage.named_parameters():
                if name not in self.aliases:
                    yield p


def retie(module: nn.Module, pairs: Iterable[tuple[str, str]]) -> None:
    """Make each alias the canonical parameter again where `module` holds both (tensor parallelism
    replaces parameters with sharded ones one module at a time, which unties them)."""
    names = dict(module.named_parameters(remove_duplicate=False))
    for canonical, alias in pairs:
        if canonical in names and alias in names and names[canonical] is not names[alias]:
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner), attr, names[canonical])
