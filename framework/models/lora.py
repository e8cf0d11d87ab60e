"""LoRA (and DoRA) adapters on the linear layers of any model's blocks.

Each adapted nn.Linear becomes a LoRALinear: the same module with the same `weight` (and `bias`), frozen,
plus lora_A (rank x in) and lora_B (out x rank) whose product, scaled by alpha / rank, is added to the
weight's output -- PEFT's layout and names, so an adapter saved from here loads into `peft`. lora_B starts
at zero (the adapted model starts as the base); lora_A from (seed, name), so every rank and every layout
starts alike. DoRA (`lora.dora`) adds a per-row magnitude, starting at the rows' norms of the base weight, and
rescales the adapted weight to it (Liu et al. 2024; PEFT's use_dora). Every other parameter is frozen:
only the adapters are trained, stepped and reduced.

The frozen weights may be stored in `lora.base_dtype`: bfloat16, float8 (torchao's weight-only float8,
row-wise scales) or nf4 (torchao's NF4Tensor, QLoRA); the adapters stay float32.
"""
from __future__ import annotations

import contextlib
import math
import re
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from framework.models.seeding import param_seed

ADAPTER_SUFFIXES = ("lora_A", "lora_B", "lora_magnitude")
BASE_DTYPES = ("float32", "bfloat16", "float8", "nf4")
NF4_BLOCK = 64          # elements per NF4 block (torchao's default), or the largest power of two dividing the weight
NF4_SCALER_BLOCK = 256  # blocks per double-quantised scale (torchao's default), or the largest divisor below it

_off = [False]      # adapters_off(): every LoRALinear computes its frozen base alone


@contextlib.contextmanager
def adapters_off():
    """Within: every adapted linear is its base (the adapters and a DoRA magnitude left out), in every module of
    the process, whatever wraps it (DDP, FSDP2, DeepSpeed's engine, a pipeline stage): a preference objective's
    reference model with no second copy of the weights (TRL's `use_adapter(model, None)`)."""
    previous, _off[0] = _off[0], True
    try:
        yield
    finally:
        _off[0] = previous


class LoRALinear(nn.Linear):
    """nn.Linear(x) + dropout(x) A^T B^T * alpha / rank, with the linear's own weight frozen."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float,
                 dropout: float = 0.0, dora: bool = False, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        self.lora_A = nn.Parameter(torch.zeros(rank, in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device))
        self.lora_magnitude = nn.Parameter(torch.ones(out_features, device=device)) if dora else None
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def base_weight(self, dtype) -> torch.Tensor:
        return dequantized(self.weight, dtype)

    def delta(self) -> torch.Tensor:
        """The adapter's change of the weight (out x in), fp32: B A * scaling (DoRA: its merged weight minus the base)."""
        base = self.base_weight(torch.float32)
        if self.lora_magnitude is None:
            return (self.lora_B @ self.lora_A) * self.scaling
        merged = base + (self.lora_B @ self.lora_A) * self.scaling
        return merged * (self.lora_magnitude / merged.norm(dim=1)).unsqueeze(1) - base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _off[0]:
            return self._frozen(x)
        a, b = self.lora_A.to(x.dtype), self.lora_B.to(x.dtype)
        if self.lora_magnitude is not None:
            # DoRA, as PEFT computes it: the base output scaled to the magnitude, with the norm not differentiated
            weight = self.base_weight(x.dtype)
            norm = (weight.float() + (self.lora_B @ self.lora_A).float() * self.scaling).norm(dim=1).detach()
            scale = (self.lora_magnitude / norm).to(x.dtype)
            base = F.linear(x, weight)
            adapted = (self.lora_dropout(x) @ a.t()) @ b.t() * self.scaling
            out = (scale - 1) * base + scale * adapted + base
            out = out if self.bias is None else out + self.bias.to(out.dtype)
            return out.to(base.dtype)       # the fp32 magnitude made it fp32; PEFT returns the base linear's dtype
        out = self._frozen(x)
        # PEFT's out + lora_B(lora_A(x)) * scaling with the scaling and the sum inside the second GEMM (addmm's
        # alpha and added input): PEFT's mul and add over the whole output, and the mul of its gradient, took
        # 11-35% of an adapted linear's forward and backward at lora_tiny's sizes (2048 tokens, 64 in, rank 16)
        h = F.linear(self.lora_dropout(x), a)
        return torch.addmm(out.reshape(-1, out.shape[-1]), h.reshape(-1, h.shape[-1]), b.t(),
                           alpha=self.scaling).view_as(out)

    def _frozen(self, x: torch.Tensor) -> torch.Tensor:
        w, bias = self.weight, None if self.bias is None else self.bias.to(x.dtype)
        if hasattr(w, "get_original_weight"):
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4
            out = linear_nf4(x, w)
            return out if bias is None else out + bias
        return F.linear(x, dequantized(w, x.dtype), bias)


def dequantized(w: torch.Tensor, dtype) -> torch.Tensor:
    """A frozen base weight as the values it stands for, in `dtype`, whichever `lora.base_dtype` stores it."""
    if hasattr(w, "get_original_weight"):           # NF4
        return w.get_original_weight().to(dtype)
    if hasattr(w, "dequantize"):                    # torchao float8
        return w.dequantize().to(dtype)
    return w.to(dtype)


def pickled_base_classes() -> list[type]:
    """Tensor classes a checkpoint stores a frozen base weight as, pickled whole (DCP writes NF4Tensor so);
    a reader allows these classes, and no others, when it unpickles a checkpoint's tensors."""
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor
    except ImportError:                 # torchao absent: no checkpoint of this install holds one
        return []
    return [NF4Tensor]


def is_adapter(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ADAPTER_SUFFIXES


def target_linears(model: nn.Module, block_classes: tuple[type, ...], targets: Iterable[str],
                   skip: Iterable[str] = ()) -> list[str]:
    """Names of the nn.Linear modules to adapt: inside the blocks, whose name ends with one of `targets`
    (every one where `targets` is empty), not matching `skip` (a spec's non-adaptable linears, MoE routers)."""
    targets, skip = tuple(targets), tuple(skip)
    names = set()
    for block_name, block in model.named_modules():
        if not isinstance(block, block_classes):
            continue
        for name, module in block.named_modules():
            full = f"{block_name}.{name}" if name else block_name
            if type(module) is not nn.Linear and not isinstance(module, LoRALinear):
                continue
            if targets and not any(full == t or full.endswith("." + t) for t in targets):
                continue
            if any(re.search(pattern, full) for pattern in skip):
                continue
            names.add(full)
    return sorted(names)


def apply_lora(model: nn.Module, names: list[str], rank: int, alpha: float, dropout: float = 0.0,
               dora: bool = False) -> nn.Module:
    """Swap each named nn.Linear for a LoRALinear holding the same weight (and bias) tensors, on the same
    device (meta included); freeze everything but the adapters."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        with torch.device(old.weight.device):
            new = LoRALinear(old.in_features, old.out_features, old.bias is not None, rank, alpha, dropout, dora)
        new.weight = old.weight
        if old.bias is not None:
            new.bias = old.bias
        setattr(parent, child, new)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return model


@torch.no_grad()
def init_adapter(name: str, tensor: torch.Tensor, seed: int, base: torch.Tensor | None = None) -> None:
    """lora_A: PEFT's default, kaiming-uniform with a = sqrt(5) (bound 1 / sqrt(in)), from (seed, name); lora_B:
    zeros; lora_magnitude: the rows' norms of `base` (the full base weight)."""
    suffix = name.rsplit(".", 1)[-1]
    if suffix == "lora_B":
        tensor.zero_()
    elif suffix == "lora_magnitude":
        tensor.copy_(base.float().norm(dim=1))
    else:
        bound = 1 / math.sqrt(tensor.shape[1])
        gen = torch.Generator().manual_seed(param_seed(seed, name))
        tensor.copy_(torch.rand(tensor.shape, generator=gen, dtype=torch.float32) * 2 * bound - bound)


def base_of(name: str) -> str:
    """The frozen weight an adapter parameter belongs to."""
    return name.rsplit(".", 1)[0] + ".weight"


@torch.no_grad()
def store_base(model: nn.Module, base_dtype: str) -> None:
    """Put every LoRALinear's frozen weight in `base_dtype` (after its values are in place)."""
    if base_dtype == "float32":
        return
    for module in model.modules():
        if not isinstance(module, LoRALinear):
            continue
        w = module.weight.detach()
        if base_dtype == "bfloat16":
            stored = w.to(torch.bfloat16)
        elif base_dtype == "nf4":
            stored = _nf4(w)
        else:
            stored = _float8(w)
        module.weight = nn.Parameter(stored, requires_grad=False)


def _nf4(w: torch.Tensor) -> torch.Tensor:
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    return to_nf4(w.float(), *nf4_blocks(w.numel()))


@torch.no_grad()
def _float8(w: torch.Tensor) -> torch.Tensor:
    from torchao.quantization import Float8WeightOnlyConfig, quantize_
    holder = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device)
    holder.weight.data.copy_(w)
    quantize_(holder, Float8WeightOnlyConfig())
    return holder.weight.detach()


def base_read_target(shape, base_dtype: str) -> torch.Tensor | None:
    """A tensor of `shape` that a checkpoint's base weight stored in `base_dtype` reads into, where that is a
    tensor subclass copying only into another of its kind (NF4 of the same blocks, float8): its values are
    overwritten (ones keep the quantisation's scales finite). None where the stored weight is a plain tensor."""
    quantized = {"nf4": _nf4, "float8": _float8}.get(base_dtype)
    return quantized(torch.ones(shape)) if quantized else None


def nf4_blocks(numel: int) -> tuple[int, int]:
    """(block size, scaler block size) torchao's NF4 takes for a weight of `numel` elements."""
    block = next(b for b in (NF4_BLOCK, 32, 16, 8, 4, 2, 1) if numel % b == 0)
    scalers = numel // block
    return block, next(s for s in range(min(NF4_SCALER_BLOCK, scalers), 0, -1) if scalers % s == 0)


def merged_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full fp32 weights of every LoRALinear with its adapter merged in: name.weight -> base + delta."""
    return {f"{name}.weight": module.base_weight(torch.float32) + module.delta()
            for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def adapter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if is_adapter(n))
