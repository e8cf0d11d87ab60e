"""What one micro-batch's forward, loss and backward ask of a device, by operator class, traced on fake
tensors (no memory, no arithmetic): the job's own model, activation checkpointing and autocast run
forward and backward once under FakeTensorMode, and every operator is recorded as

- a matmul (mm, addmm, bmm, grouped mm): its FLOPs and the bytes it reads and writes,
- attention (an SDPA kernel, forward or backward): its FLOPs (causal: half the score matrix),
- anything else (norms, activations, rope, residual adds, casts, the loss): bytes read and written.

Two byte counts are kept for the rest. `memory_bytes` is what eager moves: every operator reads its
inputs and writes its output. `fused_bytes` is what a compiled block moves: inside a block, pointwise
and reduction operators fuse, so a tensor one of them makes and another of them reads in the same pass
(forward or backward) never reaches memory; it is written once when something outside the fusion (a
matmul, attention, the other pass) reads it. That is the least a fusing compiler can move: inductor's own
count of what its kernels read and write is 0.95-1.35x of it on a CPU (benchmarks/compiled_block_traffic.py),
where it splits reductions along other axes, materialises a cat and copies attention's inputs into the
layout the CPU kernel wants. Operators outside the blocks (embedding, head, loss) are not compiled
(trainer.compile compiles blocks) and count as eager in both.

Blocks are told apart from the head and tail by module hooks (forward) and module backward hooks.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.parallel.blocks import find_blocks
from framework.plan import attention_kernel, few_blocks
from framework.plan.activations import job_autocast, job_model
from framework.plan.cache_key import config_key
from framework.plan.layout import Casting

if TYPE_CHECKING:
    from framework.config.schema import Config

MATMULS = ("mm", "addmm", "bmm", "_grouped_mm", "baddbmm")
ATTENTION = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
# ops that make no new data (views, metadata): free on any device
FREE = ("view", "_unsafe_view", "reshape", "t", "transpose", "expand", "unsqueeze", "squeeze", "slice", "select",
        "as_strided", "detach", "alias", "permute", "split", "split_with_sizes", "unbind", "chunk", "lift_fresh",
        "_reshape_alias", "narrow", "view_as_real", "view_as_complex", "unflatten", "flatten", "empty", "empty_like",
        "new_empty", "empty_strided", "new_empty_strided", "zeros", "zeros_like", "ones_like", "ones", "arange",
        "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "is_same_size", "scalar_tensor")


@dataclass
class OpCosts:
    """One micro-batch's operators on the whole (untensor-parallel) model, split into blocks and the rest."""
    matmuls: dict = field(default_factory=dict)   # (m, n, k, bytes_per_element) -> count, per part
    attention_flops: dict = field(default_factory=dict)   # part -> FLOPs ("block" / "rest")
    memory_bytes: dict = field(default_factory=dict)      # part -> bytes the eager operators move
    fused_bytes: dict = field(default_factory=dict)       # part -> bytes with pointwise work fused in blocks
    kernels: dict = field(default_factory=dict)           # part -> eager kernel launches
    fused_kernels: dict = field(default_factory=dict)     # part -> kernels when blocks are compiled

    def add(self, table: str, part: str, value, key=None) -> None:
        store = getattr(self, table)
        if key is None:
            store[part] = store.get(part, 0) + value
        else:
            inner = store.setdefault(part, {})
            inner[key] = inner.get(key, 0) + value


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _attention_flops(name: str, args) -> float:
    """Forward 4*b*h*sq*sk*d (two matmuls), backward 2.5x that; a causal kernel does half."""
    q, k = args[0], args[1]
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
        return 0.0
    # q: (b, h, s, d) for every SDPA kernel's forward and backward (grad_out comes first in backward)
    b, h, sq, d = q.shape[0], q.shape[1], q.shape[-2], q.shape[-1]
    sk = k.shape[-2]
    flops = 4.0 * b * h * sq * sk * d
    causal = sq == sk           # our models' attention is causal; cp's chunks see at most their keys
    if causal:
        flops /= 2
    return flops * (2.5 if "backward" in name else 1.0)


class _Recorder(TorchDispatchMode):
    def __init__(self, costs: OpCosts, in_block, phase):
        super().__init__()
        self.costs = costs
        self.in_block = in_block
        self.phase = phase
        self.fusable: dict[int, tuple] = {}    # storage id -> (ref, nbytes, phase, written)

    def _read(self, t, fusing: bool) -> int:
        """Bytes a compiled block pays to read `t`: nothing when it is still inside the fusion."""
        key = id(t.untyped_storage())
        entry = self.fusable.get(key)
        if entry is None or entry[0]() is None:
            return _nbytes(t)
        ref, nbytes, phase, written = entry
        if fusing and phase == self.phase():
            return 0
        if not written:
            self.fusable[key] = (ref, nbytes, phase, True)
            return nbytes + _nbytes(t)      # written out once, then read
        return _nbytes(t)

    def _written_for(self, part: str, ins) -> None:
        """A matmul or attention reads its inputs itself (its own cost); a fused producer's output that it
        reads is written out first, once."""
        written = sum(self._read(t, False) - _nbytes(t) for t in ins)
        if part == "block":
            self.costs.add("fused_bytes", part, written)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if name in FREE or not outs:
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        part = "block" if self.in_block() else "rest"
        moved = sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)
        c = self.costs
        heavy = name in MATMULS or name.startswith(ATTENTION)
        c.add("kernels", part, 1)
        if part == "rest":
            c.add("fused_kernels", part, 1)
        elif heavy:
            c.add("fused_kernels", part, 2)     # the kernel, and the fused group of pointwise work after it
        if name in MATMULS:
            a, b = ins[-2], ins[-1]
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            # a batched matmul counts its batch; a grouped one, (tokens, k) x (experts, k, n), each token once
            batch = 1 if name == "_grouped_mm" else a.numel() // (m * k)
            c.add("matmuls", part, batch, (m, n, k, a.element_size()))
            self._written_for(part, ins)
            return out
        if name.startswith(ATTENTION):
            c.add("attention_flops", part, _attention_flops(name, args))
            self._written_for(part, ins)
            return out
        c.add("memory_bytes", part, moved)
        if part == "block":
            fused_in = sum(self._read(t, True) for t in ins)
            c.add("fused_bytes", part, fused_in)
            for t in outs:
                self.fusable[id(t.untyped_storage())] = (weakref.ref(t.untyped_storage()), _nbytes(t), self.phase(),
                                                         False)
        else:
            c.add("fused_bytes", part, moved)
        return out


_CACHE: dict = {}


class Traced:
    """A micro-batch of one sequence and of two: what grows with the micro-batch is their difference, and
    what does not (autocast's weight copies, the gradients' accumulation; most of an MoE layer's
    traffic at short sequences) is the rest. The second trace is made only when asked for."""

    def __init__(self, cfg: Config, seq_len: int, kernel: str):
        self._args = (cfg, seq_len, kernel)
        self.one = traced(cfg, 1, seq_len, kernel)

    @property
    def two(self) -> OpCosts:
        cfg, seq_len, kernel = self._args
        return traced(cfg, 2, seq_len, kernel)


def traced_per_sequence(cfg: Config, seq_len: int, kernel: str = attention_kernel.FUSED) -> Traced:
    return Traced(cfg, seq_len, kernel)


def traced(cfg: Config, micro_batch: int, seq_len: int, kernel: str = attention_kernel.FUSED,
           casting: Casting = Casting()) -> OpCosts:
    """The operators of one micro-batch of `micro_batch` sequences of `seq_len` tokens, attention on
    `kernel` (cached).

    Traced under autocast from fp32 weights whatever the strategy: where a wrapper hands the blocks weights
    already cast (FSDP2's policy, DeepSpeed's bf16 engine), its own casts - of each shard as it is gathered,
    of the gradients back to fp32 - take the place of autocast's, as the H100 rows show (the 870M job ran
    0.312 s a step under fsdp on one GPU, 0.307 s under single). `casting` traces another dtype (the
    compiled-traffic benchmark compares both with inductor's own count)."""
    key = (config_key(cfg.model), config_key(cfg.activation_checkpointing),
           cfg.precision.name, int(cfg.data.vocab_size), kernel, micro_batch, seq_len, casting)
    if key not in _CACHE:
        _CACHE[key] = _trace_few_blocks(cfg, micro_batch, seq_len, kernel, casting)
    return _CACHE[key]


def _trace_few_blocks(cfg: Config, micro_batch: int, seq_len: int, kernel: str,
                      casting: Casting = Casting()) -> OpCosts:
    """The model traced with two and with three periods of blocks (framework/plan/few_blocks.py) gives the
    first and last blocks' cost and each further period's."""
    shorter = [few_blocks.shortened(cfg, n) for n in (2, 3)]
    if None in shorter:
        return _trace(cfg, micro_batch, seq_len, kernel, casting)
    two, three = (_trace(c, micro_batch, seq_len, kernel, casting) for c in shorter)
    more = few_blocks.periods(cfg) - 2
    for table in ("attention_flops", "memory_bytes", "fused_bytes", "kernels", "fused_kernels"):
        store, extra = getattr(two, table), getattr(three, table)
        if "block" in store:
            store["block"] += more * (extra["block"] - store["block"])
    two.matmuls["block"] = {shape: n + more * (three.matmuls["block"][shape] - n)
                            for shape, n in two.matmuls.get("block", {}).items()}
    return two


def _as_float8_on_a_gpu(model, cfg: Config, spec) -> None:
    """precision=float8: the blocks' linears as a GPU run converts them (torchao's Float8Linear, no
    emulation), so their inputs', weights' and gradients' scaling and casts are traced; the matmuls show
    as the float8 tensors' own mm, at the bf16 shapes the planner times at the device's fp8 peak."""
    if cfg.precision.name != "float8":
        return
    from omegaconf import OmegaConf
    from framework.parallel.float8 import convert_float8
    on_gpu = OmegaConf.merge(cfg.precision, {"float8_emulate": False})
    convert_float8(model, on_gpu, spec, fsdp=False)


def _trace(cfg: Config, micro_batch: int, seq_len: int, kernel: str, casting: Casting = Casting()) -> OpCosts:
    from torch._subclasses.fake_tensor import FakeTensorMode
    spec = spec_for(cfg.model)
    costs = OpCosts()
    depth = [0]
    phase = ["forward", 0]      # pass, and which entry into a block: a compiled block fuses within itself only

    def enter(*_):
        depth[0] += 1
        phase[1] += 1

    def leave(*_):
        depth[0] -= 1
        phase[1] += 1
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = job_model(cfg, spec, casting)
        _as_float8_on_a_gpu(model, cfg, spec)
        handles = []
        for _, block in find_blocks(model, spec.block_classes(model)):
            handles += [block.register_forward_pre_hook(enter), block.register_forward_hook(leave),
                        block.register_full_backward_pre_hook(enter), block.register_full_backward_hook(leave)]
        tokens = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        recorder = _Recorder(costs, lambda: depth[0] > 0, lambda: tuple(phase))
        with recorder, attention_kernel.tracing(kernel):
            with job_autocast(cfg.precision.name, casting):
                loss = cross_entropy(model(tokens), tokens)
            phase[0] = "backward"
            depth[0] = 0
            phase[1] += 1
            loss.backward()
        for h in handles:
            h.remove()
    return costs
