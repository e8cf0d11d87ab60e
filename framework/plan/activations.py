"""Activation bytes, measured on shapes alone: the model runs forward (and its loss) once under
FakeTensorMode, so no memory is allocated and no arithmetic done, and every tensor created is recorded
with the module whose forward created it. What is still alive when the loss exists is what autograd
keeps for backward. The same code path as the job (its activation checkpointing, its autocast) runs,
so checkpointed blocks keep only their inputs, bf16 matmul outputs are 2 bytes, and an SDPA kernel
keeps no s^2 scores.

Tensor parallelism is applied per tensor from the model spec's plan: outputs of column-parallel
modules and of what runs between them and the row-parallel ones (attention, the MLP's activation)
are split tp ways; row-parallel outputs, norms and residual adds are whole on each rank unless
sequence parallelism splits them along the sequence. Pipeline stages keep their own blocks' share.

Autocast's low-precision copies of the weights (COPIES), which the backward of each matmul keeps, are
made once per step whatever the micro-batch: they are counted apart from what grows with it.

A compiled block (trainer.compile) keeps less: inductor's partitioner saves what the matmuls and
attention read and make (the norms' low-precision outputs, rope's q and k, attention's output and the copy
of it laid out for the output projection, the MLP's gate, up and product) and the block's input, and
recomputes the rest from them: the norms' fp32 work and the residual inside the block are not kept.
`compiled` is the same profile with only those kept in blocks. Checked with saved-tensor hooks on
CPU-inductor-compiled Llama blocks, which partition as on a GPU (`python
benchmarks/compiled_activation_bytes.py`): within 0.1% of the plan, with fp32 weights under bf16
autocast and with bf16 weights, eager and compiled; the 870M job's two compiled H100 rows (single and
fsdp, docs/benchmarks/h100.md) are planned at 0.99 of their measured peaks.

Where the strategy hands the blocks weights already in low precision (FSDP2's mixed-precision policy,
DeepSpeed's bf16 engine: `casting`, from Layout.casting), the model is traced with its parameters in that
dtype: no weight copies, and a residual stream in bf16.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils._python_dispatch import TorchDispatchMode

from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.parallel.activation_checkpointing import checkpoint_activations
from framework.parallel.blocks import find_blocks
from framework.parallel.precision import compute_dtype
from framework.plan import attention_kernel, few_blocks
from framework.plan.cache_key import config_key
from framework.plan.layout import Casting

if TYPE_CHECKING:
    from framework.config.schema import Config

SPLIT, WHOLE, SEQUENCE = "split", "whole", "sequence"   # how tensor parallelism divides a tensor
COPIES = "copies"       # autocast's casts of the weights: split by tp like the weights, not by micro-batch
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
ATTENTION = ("aten::_scaled_dot_product", "aten::_efficient_attention", "aten::_flash_attention")
# matmul and attention ops: a compiled block keeps what they read, and what they make where eager keeps it
SAVED_BY_COMPILE = (*MATMULS, *ATTENTION, "aten::embedding")


@dataclass(frozen=True)
class ActivationProfile:
    """Live bytes after forward of one micro-batch, by where they were made and how TP divides them."""
    head: dict          # kind -> bytes made outside any block before the first one (embeddings)
    blocks: list        # per block: kind -> bytes
    tail: dict          # after the last block (final norm, head, logits, loss)
    block_full: int     # bytes one block keeps without checkpointing (what a recompute makes again)
    block_largest: int = 0   # its largest kept tensor: backward holds that tensor's gradient and the one before
    compiled: "ActivationProfile | None" = None   # the same with compiled blocks

    def stage_copies(self, block_ids: list[int], first: bool, last: bool, tp: int) -> int:
        """Bytes of the stage's weight copies autocast keeps, the same for any micro-batch."""
        parts = [self.blocks[i] for i in block_ids] + ([self.head] if first else []) + ([self.tail] if last else [])
        return int(sum(p.get(COPIES, 0) for p in parts) / tp)

    def stage_bytes(self, block_ids: list[int], first: bool, last: bool, tp: int, sp: bool) -> int:
        """Bytes of one sequence's activations the stage keeps (they grow with the micro-batch)."""
        def divided(kinds: dict) -> float:
            return (kinds.get(SPLIT, 0) / tp + kinds.get(SEQUENCE, 0) / (tp if sp else 1)
                    + kinds.get(WHOLE, 0))
        total = sum(divided(self.blocks[i]) for i in block_ids)
        if first:
            total += divided(self.head)
        if last:
            total += divided(self.tail)
        return int(total)


def _alive(table: dict, storage) -> bool:
    ref = table.get(id(storage))
    return ref is not None and ref() is storage


class _LiveTensors(TorchDispatchMode):
    """Every tensor an op creates, keyed by its storage, with who made it, and whether a compiled block
    would keep it: what a matmul or attention makes or reads, the block's input (its first norm's backward
    needs it, and nothing in the block can make it again), one cast where autocast casts a tensor once per
    matmul reading it (inductor merges them), and the copy of attention's output laid out for the output
    projection (a view in eager; inductor materialises it, and keeps both)."""

    def __init__(self, where, existing):
        super().__init__()
        self.where = where
        self.existing = existing        # storages of parameters and buffers: views of them are not new
        self.known = {id(s) for s in existing}
        self.made: dict[int, tuple] = {}
        self.read_by_matmul: dict[int, weakref.ref] = {}
        self.attention_made: dict[int, weakref.ref] = {}
        self.casts: dict[tuple, tuple] = {}     # (source storage id, offset, shape, dtype) -> (source, first cast)
        self.repeated_casts: dict[int, weakref.ref] = {}
        self.layout_copies: list[tuple] = []            # (attention output's storage, bytes, where)
        self.inputs: list[tuple] = []                   # (block input's storage, bytes, where)

    def keep(self, t: torch.Tensor) -> None:
        """A compiled block keeps `t`, its input, even where eager keeps only an upcast copy of it."""
        storage = t.untyped_storage()
        self.read_by_matmul[id(storage)] = weakref.ref(storage)
        if id(storage) in self.made:
            self.inputs.append((weakref.ref(storage), storage.nbytes(), self.made[id(storage)][2]))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        matmul = func.name().startswith(SAVED_BY_COMPILE)
        if matmul:
            for t in args:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    self.read_by_matmul[id(storage)] = weakref.ref(storage)
                    if func.name() in MATMULS and _alive(self.attention_made, storage):
                        where = self.made[id(storage)][2] if id(storage) in self.made else self.where()
                        self.layout_copies.append((weakref.ref(storage), t.numel() * t.element_size(), where))
        is_copy = (func is torch.ops.aten._to_copy.default and source is not None
                   and id(source.untyped_storage()) in self.known)
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        if func is torch.ops.aten._to_copy.default and source is not None and not is_copy and outs:
            made = outs[0].untyped_storage()
            cast = (id(source.untyped_storage()), source.storage_offset(), tuple(source.shape), outs[0].dtype)
            of, first = self.casts.get(cast, (None, None))
            # ids are reused: the earlier cast must be alive and of this very source
            if of is not None and of() is source.untyped_storage() and first() is not None:
                self.repeated_casts[id(made)] = weakref.ref(made)
            else:
                self.casts[cast] = (weakref.ref(source.untyped_storage()), weakref.ref(made))
        for t in outs:
            storage = t.untyped_storage()
            key = id(storage)
            if func.name().startswith(ATTENTION):
                self.attention_made[key] = weakref.ref(storage)
            earlier = self.made.get(key)
            # ids are reused once a storage dies: a dead entry under this id is another tensor's
            if key not in self.known and (earlier is None or earlier[0]() is None):
                where = self.where()
                if is_copy:
                    where = (*where[:2], COPIES)
                kept = is_copy or matmul
                self.made[key] = (weakref.ref(storage), storage.nbytes(), where, kept)
        return out

    def alive(self):
        """(bytes, where, kept in eager, kept by a compiled block) of every tensor still alive."""
        for key, (ref, nbytes, where, kept) in self.made.items():
            storage = ref()
            if storage is not None:
                compiled = (kept or _alive(self.read_by_matmul, storage)) and not _alive(self.repeated_casts, storage)
                yield nbytes, where, True, compiled
        for ref, nbytes, where in self.layout_copies:
            if ref() is not None:
                yield nbytes, where, False, True
        for ref, nbytes, where in self.inputs:
            if ref() is None:           # freed in eager (still alive, it was counted above)
                yield nbytes, where, False, True


def _kind_of(module: nn.Module | None, style, in_block: bool) -> str:
    if isinstance(style, ColwiseParallel):
        return WHOLE if isinstance(module, nn.Embedding) else SPLIT
    if isinstance(style, RowwiseParallel):
        return SEQUENCE
    if module is None or "norm" in type(module).__name__.lower():
        return SEQUENCE if in_block else WHOLE
    return SPLIT if in_block else WHOLE


def job_model(cfg: Config, spec, casting: Casting = Casting()) -> nn.Module:
    """The model as the job builds it before any wrap (its activation checkpointing included), every
    parameter trained, in the dtype the job's wrapper computes with (`casting`: buffers stay as built, as
    FSDP2's policy and DeepSpeed's engine leave them); under FakeTensorMode, shapes only."""
    model = spec.build(cfg.model)
    checkpoint_activations(model, cfg.activation_checkpointing, spec)
    dtype = compute_dtype(cfg.precision.name) if casting.weights else None
    for p in model.parameters():
        if dtype is not None and p.dtype != dtype:
            p.data = p.data.to(dtype)
        p.requires_grad_(True)
    return model


def job_autocast(precision: str, casting: Casting = Casting()):
    """The autocast the job's forward runs under, on the CPU where the fake tensors live."""
    if precision in ("bf16", "fp16", "float8") and casting.autocast:
        return torch.autocast("cpu", dtype=compute_dtype(precision))
    return torch.autocast("cpu", enabled=False)


def measure(cfg: Config, micro_batch: int, seq_len: int, cp: int = 1, kernel: str = attention_kernel.FUSED,
            casting: Casting = Casting()) -> ActivationProfile:
    """One forward + loss of the model as the job builds it (AC and precision included), on fake tensors,
    with attention on `kernel` (attention_kernel: the math kernel keeps its s x s scores).
    cp > 1: seq_len is a cp rank's share, and its positions are held (framework.models.positions) as the
    job holds them, so RoPE keeps the rows gathered for them rather than a view of its whole table.
    casting: whether the job's wrapper casts the weights and whether it autocasts (Layout.casting)."""
    key = (config_key(cfg.model), config_key(cfg.activation_checkpointing),
           cfg.precision.name, cfg.precision.param_dtype, Casting(*casting), kernel, micro_batch, seq_len, cp,
           documents(cfg))
    return _measure(key, cfg)


def documents(cfg: Config) -> bool:
    """Whether the job's forwards take packed documents (data.document_mask): the trace then builds their
    positions and attention mask as the job does -- the dense seq x seq mask of the CPU path, which attention
    keeps for backward (on CUDA flex_attention's block mask is far smaller: an upper bound there)."""
    data = cfg.get("data")
    return bool(data is not None and data.get("document_mask"))


_CACHE: dict = {}


def _measure(key, cfg: Config) -> ActivationProfile:
    if key in _CACHE:
        return _CACHE[key]
    casting, kernel, micro_batch, seq_len, cp, packed = key[4:]
    short = few_blocks.shortened(cfg, 3)
    if short is not None:
        three = measure(short, micro_batch, seq_len, cp, kernel, casting)
        _CACHE[key] = _repeated(three, few_blocks.period(cfg), few_blocks.periods(cfg))
        return _CACHE[key]
    from torch._subclasses.fake_tensor import FakeTensorMode
    from framework.models.positions import holding
    from framework.parallel.context_parallel import shard_positions
    spec = spec_for(cfg.model)
    held = holding(shard_positions(seq_len * cp, cp, 0)) if cp > 1 else contextlib.nullcontext()
    stack: list[str] = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = job_model(cfg, spec, casting)
        blocks = find_blocks(model, spec.block_classes(model))
        plan = {}
        try:
            plan = spec.tensor_parallel_plan(model, False) or {}
        except Exception:       # a model without a plan keeps everything whole
            plan = {}
        block_names = {name for name, _ in blocks}
        order = {name: i for i, (name, _) in enumerate(blocks)}
        names = {id(m): n for n, m in model.named_modules()}
        seen_last_block = [False]

        def where():
            block = next((n for n in reversed(stack) if n in block_names), None)
            inner = stack[-1] if stack else ""
            module = model.get_submodule(inner) if inner else None
            style = plan.get(inner)
            if block is not None:
                # the block's own frame: residual adds, whole on every rank unless sequence-parallel
                kind = SEQUENCE if inner == block else _kind_of(module, style, True)
                return ("block", order[block], kind)
            return ("tail" if seen_last_block[0] else "head", None, _kind_of(module, style, False))

        def pre(mod, args):
            stack.append(names[id(mod)])
            if stack[-1] in block_names and args and isinstance(args[0], torch.Tensor):
                tracker.keep(args[0])

        def post(mod, _args, _out):
            name = stack.pop()
            if name in block_names and order[name] == len(blocks) - 1:
                seen_last_block[0] = True

        handles = []
        for m in model.modules():
            if m is not model:
                handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        extra = (torch.zeros(micro_batch, seq_len, dtype=torch.int32),) if packed else ()
        tracker = _LiveTensors(where, [t.untyped_storage() for t in (*model.parameters(), *model.buffers())])
        with tracker, job_autocast(cfg.precision.name, casting), held, attention_kernel.tracing(kernel):
            logits = model(tokens, *extra)
            loss = cross_entropy(logits, tokens)
            del logits          # the trainer keeps only the loss; what backward needs is held by the graph
        head: dict = {}
        tail: dict = {}
        per_block = [dict() for _ in blocks]
        compiled_blocks = [dict() for _ in blocks]
        largest = 0
        for nbytes, (region, index, kind), eager, kept in tracker.alive():
            if region == "block" and index == 0 and kind != COPIES and eager:
                largest = max(largest, nbytes)
            bucket = per_block[index] if region == "block" else (head if region == "head" else tail)
            if eager:
                bucket[kind] = bucket.get(kind, 0) + nbytes
            if region == "block" and kept:
                compiled_blocks[index][kind] = compiled_blocks[index].get(kind, 0) + nbytes
        del loss
        for h in handles:
            h.remove()
    if cfg.activation_checkpointing.mode != "none":
        block_full, largest = _block_without_checkpointing(cfg, micro_batch, seq_len, cp, kernel, casting)
    else:
        block_full = sum(v for k, v in per_block[0].items() if k != COPIES) if per_block else 0
    compiled = ActivationProfile(head=head, blocks=compiled_blocks, tail=tail, block_full=block_full,
                                 block_largest=largest)
    profile = ActivationProfile(head=head, blocks=per_block, tail=tail, block_full=block_full,
                                block_largest=largest, compiled=compiled)
    _CACHE[key] = profile
    return profile


def _repeated(three: ActivationProfile, period: int, periods: int) -> ActivationProfile:
    """The profile of `periods` periods of blocks from that of three: the first and last as traced, the
    middle one for every period between them (few_blocks)."""
    def blocks(traced: list) -> list:
        return traced[:period] + traced[period:2 * period] * (periods - 2) + traced[2 * period:]
    compiled = three.compiled and _repeated(three.compiled, period, periods)
    return ActivationProfile(head=three.head, blocks=blocks(three.blocks), tail=three.tail,
                             block_full=three.block_full, block_largest=three.block_largest, compiled=compiled)


def _block_without_checkpointing(cfg: Config, micro_batch: int, seq_len: int, cp: int, kernel: str,
                                 casting: Casting) -> tuple[int, int]:
    """(bytes, largest tensor) one block keeps when it is not checkpointed."""
    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    plain.activation_checkpointing.mode = "none"
    profile = measure(plain, micro_batch, seq_len, cp, kernel, casting)
    kept = sum(v for k, v in profile.blocks[0].items() if k != COPIES) if profile.blocks else 0
    return kept, profile.block_largest
