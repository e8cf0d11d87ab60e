"""optimizer=muon: torch.optim.Muon's update on the 2-D hidden matrices, torch.optim.AdamW's on the rest, as one
optimizer object (so ZeRO-1, the checkpoint, DCP's state dicts and the LR schedule see an ordinary optimizer).

Muon's Newton-Schulz orthogonalisation needs the whole matrix. Under FSDP2 or tensor parallelism a parameter is a
DTensor shard; torch.optim.Muon handed DTensors runs, but its matmuls then reduce bf16 partial sums across ranks:
not single's update (measured 2-3% relative). Here the momentum stays a shard (elementwise, no communication) and
the orthogonalisation runs on the whole matrix, with torch's own functions, so every layout steps like single:
  mode=gather       every rank gathers the update (full_tensor), orthogonalises it, keeps its own slice;
  mode=round_robin  matrix i belongs to data-parallel rank i % W, which gathers, orthogonalises and scatters the
                    slices back (each rank does 1/W of the Newton-Schulz work; a 1-D mesh, else as gather).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.optim import AdamW, Optimizer
# Private in torch 2.13, and no public way to orthogonalise a matrix as torch.optim.Muon does: reusing them is
# what makes this step torch's. tests/unit/optim/test_muon.py fails if they move or the step stops matching.
from torch.optim._muon import (DEFAULT_A, DEFAULT_B, DEFAULT_C, DEFAULT_NS_STEPS, EPS, _adjust_lr,
                               _zeropower_via_newtonschulz)

from framework.optim.names import ALGORITHMS, MUON_MODES



def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _slice_like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `full`, laid out like `ref` (src_data_rank=None: every rank has `full`, no collective)."""
    if not isinstance(ref, DTensor):
        return full
    return distribute_tensor(full, ref.device_mesh, ref.placements, src_data_rank=None).to_local()


def _orthogonalise(update: torch.Tensor, group: dict) -> torch.Tensor:
    return _zeropower_via_newtonschulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"])


def _round_robin(update: DTensor, group: dict, owner: int) -> torch.Tensor:
    """Gather the shards (Shard(dim) on a 1-D mesh) to `owner`, orthogonalise there, scatter the slices back."""
    pg = update.device_mesh.get_group()
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    dim = update.placements[0].dim
    rows = update.shape[dim]
    chunk = -(-rows // world)          # DTensor's Shard split: ceil(rows / world) per rank, the last ones short
    local = update.to_local()
    padded = torch.zeros((chunk, local.shape[1]) if dim == 0 else (local.shape[0], chunk), dtype=local.dtype)
    padded.narrow(dim, 0, local.shape[dim]).copy_(local)
    gathered = [torch.empty_like(padded) for _ in range(world)] if rank == owner else None
    dist.gather(padded, gathered, dst=dist.get_global_rank(pg, owner), group=pg)
    slices = None
    if rank == owner:
        ortho = _orthogonalise(torch.cat(gathered, dim=dim).narrow(dim, 0, rows), group)
        whole = torch.zeros(padded.shape[0] * world if dim == 0 else padded.shape[0],
                            padded.shape[1] * world if dim == 1 else padded.shape[1], dtype=ortho.dtype)
        whole.narrow(dim, 0, rows).copy_(ortho)
        slices = [s.contiguous() for s in whole.chunk(world, dim=dim)]
    mine = torch.empty(padded.shape, dtype=torch.bfloat16)    # Newton-Schulz's output dtype
    dist.scatter(mine, slices, src=dist.get_global_rank(pg, owner), group=pg)
    return mine.narrow(dim, 0, local.shape[dim])


def _muon_step(groups: list[dict], state: dict, mode: str) -> None:
    """torch.optim.Muon's single-tensor step (torch/optim/_muon.py), with the orthogonalisation on whole matrices."""
    index = 0      # the matrix's position over all groups: its round-robin owner is index % world
    for group in groups:
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            if "momentum_buffer" not in state[p]:
                state[p]["momentum_buffer"] = torch.zeros_like(grad)
            buf = state[p]["momentum_buffer"]
            buf.lerp_(grad, 1 - mu)                    # elementwise: stays a shard
            update = grad.lerp(buf, mu) if group["nesterov"] else buf
            if mode == "round_robin" and isinstance(p, DTensor) and p.device_mesh.ndim == 1 \
                    and isinstance(p.placements[0], Shard):
                ortho = _round_robin(update, group, owner=index % p.device_mesh.size())
            else:
                whole = update.full_tensor() if isinstance(update, DTensor) else update
                ortho = _slice_like(_orthogonalise(whole, group), p)
            local = _local(p)
            local.mul_(1 - lr * wd)                    # torch's: weight decay with the unadjusted lr
            local.add_(ortho, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))   # p.shape: the whole matrix's
            index += 1


class MuonWithAdamW(Optimizer):
    """Groups tagged algorithm="muon" take Muon's step (2-D parameters only), groups tagged "adamw" torch.optim.AdamW's
    on the same group dicts and state, with AdamW's own lr, betas, eps (`adamw_*`; eps in a muon group is
    Newton-Schulz's)."""

    ALGORITHMS = ALGORITHMS     # the factory tags each group with one

    def __init__(self, params, lr: float = 0.02, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients=(DEFAULT_A, DEFAULT_B, DEFAULT_C), eps: float = EPS,
                 ns_steps: int = DEFAULT_NS_STEPS, adjust_lr_fn: str | None = None, adamw_lr: float = 3e-3,
                 adamw_betas=(0.9, 0.95), adamw_eps: float = 1e-8, mode: str = "gather"):
        if mode not in MUON_MODES:
            raise ValueError(f"mode must be one of {MUON_MODES}, not {mode!r}")
        self.mode = mode
        self.adamw_defaults = {"lr": adamw_lr, "betas": tuple(adamw_betas), "eps": adamw_eps}
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), eps=eps, ns_steps=ns_steps,
                        adjust_lr_fn=adjust_lr_fn, algorithm="muon")
        # a shell whose groups and state are ours at each step: AdamW's arithmetic, not a copy of it
        self._adamw = AdamW([torch.zeros(1)])
        super().__init__(params, defaults)

    def add_param_group(self, group: dict) -> None:
        if group.get("algorithm", "muon") == "adamw":
            # AdamW's own defaults for what a Muon group does not have (amsgrad, maximize, ...)
            group = {**self._adamw.defaults, "weight_decay": self.defaults["weight_decay"], **self.adamw_defaults,
                     **group}
        elif any(p.ndim != 2 for p in group["params"]):      # a DTensor's ndim is the whole matrix's
            raise ValueError("Muon takes 2-D parameters only; give the others algorithm=adamw")
        super().add_param_group(group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon = [g for g in self.param_groups if g["algorithm"] == "muon"]
        adamw = [g for g in self.param_groups if g["algorithm"] == "adamw"]
        if muon:
            _muon_step(muon, self.state, self.mode)
        if adamw:
            self._adamw.param_groups, self._adamw.state = adamw, self.state
            self._adamw.step()
        return loss
