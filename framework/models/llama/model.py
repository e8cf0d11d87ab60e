"""A Llama-style decoder small enough to read in one sitting.

RMSNorm, rotary position embeddings, grouped-query attention through
scaled_dot_product_attention and a SwiGLU MLP. Layers live in a ModuleDict keyed by
their index so a pipeline stage can drop the layers it does not own and keep the
parameter names (and thus checkpoints) of the full model. The embedding, final norm
and output head may be None on pipeline stages that do not hold them.

A variant is this model with one part swapped, never a copy of it: a subclass names its arguments
dataclass (`args_class`) and builds a block's attention and feed-forward (`attention`, `feed_forward`),
and everything else (rotary tables, the chunked loss, the TP plan and pipeline split, compile, export of
the shared names) is this one code path. The MoE family (framework/models/moe) is one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from framework.models.documents import DocumentLayout, attend
from framework.models.loss import deferred_logits
from framework.models.positions import position_rows
from framework.models.seeding import param_seed


@dataclass
class RopeScaling:
    """Rotary frequencies as Hugging Face's rope_parameters names them. rope_type default: plain RoPE (the
    other keys unused); llama3: Llama 3.1's long-context scaling (these defaults are Meta's)."""
    rope_type: str = "default"              # default (plain RoPE) | llama3 (Llama 3.1's long-context scaling)
    factor: float = 8.0                     # llama3: how far the context is stretched
    low_freq_factor: float = 1.0            # llama3: wavelengths above original / this are scaled
    high_freq_factor: float = 4.0           # llama3: wavelengths below original / this are kept
    original_max_position_embeddings: int = 8192  # llama3: the context the model was trained at


def rope_scaling_dict(scaling) -> dict:
    """A RopeScaling, a dict or a DictConfig (as configs hand it over) as a plain dict with every key."""
    if is_dataclass(scaling):
        return asdict(scaling)
    return {**asdict(RopeScaling()), **dict(scaling or {})}


@dataclass
class LlamaArgs:
    dim: int = 256                          # model width (embedding and residual stream)
    n_layers: int = 4                       # transformer blocks
    n_heads: int = 8                        # attention (query) heads
    n_kv_heads: Optional[int] = None      # None = n_heads (plain multi-head attention)
    vocab_size: int = 256                   # embedding rows; follows data.vocab_size unless set
    ffn_dim: Optional[int] = None         # None = 8/3 * dim rounded up to multiple_of
    multiple_of: int = 32                   # the feed-forward width is rounded up to a multiple of this
    norm_eps: float = 1e-5                  # RMSNorm epsilon
    rope_theta: float = 10000.0             # RoPE base frequency
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_seq_len: int = 2048                 # longest sequence the positions are built for
    tie_embeddings: bool = False            # the output head shares the embedding's weight
    init_std: float = 0.02                  # standard deviation of the seeded normal init
    # training: the loss projects and upcasts this many tokens' logits at a time (framework/models/loss.py), 0 = all at once
    loss_chunk_tokens: int = 0

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_dim:
            return self.ffn_dim
        hidden = int(8 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    def num_params(self, include_embedding: bool = True) -> int:
        """Parameter count from the shapes alone (no model needed: used for MFU and planning)."""
        d, h = self.dim, self.hidden_dim
        attn = d * d + 2 * d * self.kv_heads * self.head_dim + d * d
        block = attn + 3 * d * h + 2 * d
        n = self.n_layers * block + d
        emb = self.vocab_size * d
        n += emb if self.tie_embeddings else 2 * emb
        if not include_embedding:
            n -= emb
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12*L*H*Q*T (the PaLM / nanoGPT estimate), N without the embedding lookup."""
        return 6 * self.num_params(include_embedding=False) + 12 * self.n_layers * self.n_heads * self.head_dim * seq_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
ROPE_TYPES = ("default", "llama3")


def llama3_frequencies(freqs: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's scaled rotary frequencies: wavelengths beyond the original context are stretched by
    `factor`, those within `original / high_freq_factor` kept, the band between blended smoothly."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freqs
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * freqs / factor + smooth * freqs


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None,
                scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    scaling = rope_scaling_dict(scaling)
    if scaling["rope_type"] == "llama3":
        freqs = llama3_frequencies(freqs, scaling)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos, sin (seq, head_dim / 2) or, per token of packed documents,
    (batch, seq, head_dim / 2). Rotates interleaved pairs (HF's layout is converted on export)."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if cos.dim() == 2 else (cos[:, :, None], sin[:, :, None])
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return rotated.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None) -> torch.Tensor:
        """`mask`: packed documents' attention (framework.models.documents), with cos/sin already per token."""
        bsz, seq, _ = x.shape
        # -1 instead of the head counts: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        q, k = self.norm_qk(q, k)
        if cos.dim() == 2:
            cos, sin = position_rows(cos, seq), position_rows(sin, seq)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = attend(q, k, v, mask, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (batch, seq, heads, head_dim) before RoPE; Llama leaves them as they are (a subclass may
        normalise them per head, as Qwen3 does)."""
        return q, k


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)   # gate
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)   # up
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)   # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward, each added to the residual stream; which attention and which
    feed-forward are the model's to choose."""

    def __init__(self, args: LlamaArgs, attention: nn.Module, feed_forward: nn.Module):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = attention
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = feed_forward

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask=None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


def rope_inputs(args, device, documents: Optional[torch.Tensor]):
    """(cos, sin, attention mask) every block of a forward takes: tables for every position (under sequence
    parallelism a block holds only a slice of the sequence), or with packed documents the rows of each token's
    position in its document and the mask that keeps it there."""
    cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta, device=device, scaling=args.rope_scaling)
    if documents is None:
        return cos, sin, None
    layout = DocumentLayout(documents)
    return layout.rows(cos), layout.rows(sin), layout.mask


class Llama(nn.Module):
    args_class: type = LlamaArgs

    def __init__(self, **kwargs):
        super().__init__()
        self.args = args = self.args_class(**kwargs)
        self.tok_embeddings: Optional[nn.Embedding] = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args, self.attention(args, i), self.feed_forward(args, i))
                                     for i in range(args.n_layers)})
        self.norm: Optional[RMSNorm] = RMSNorm(args.dim, args.norm_eps)
        self.output: Optional[nn.Linear] = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        """tokens (batch, seq) of ids -> logits; on inner pipeline stages hidden states in and out. `documents`
        (batch, seq): packed documents' numbers (framework.models.documents)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        cos, sin, mask = rope_inputs(self.args, h.device, documents)
        for layer in self.layers.values():
            h = layer(h, cos, sin, mask)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is None:
            return h
        if self.training and self.args.loss_chunk_tokens:
            return deferred_logits(h, self.output, self.args.loss_chunk_tokens)
        return self.output(h).float()

    def attention(self, args, layer_id: int) -> nn.Module:
        """Block `layer_id`'s attention (a variant may swap it)."""
        return Attention(args)

    def feed_forward(self, args, layer_id: int) -> nn.Module:
        """Block `layer_id`'s feed-forward: a SwiGLU MLP (a variant may swap it)."""
        return FeedForward(args.dim, args.hidden_dim)

    def block_classes(self) -> tuple[type, ...]:
        return (TransformerBlock,)

    def flops_per_token(self, seq_len: int) -> float:
        return self.args.flops_per_token(seq_len)


@torch.no_grad()
def init_parameter(tensor: torch.Tensor, name: str, seed: int, n_layers: int, std: float = 0.02) -> None:
    """Fill one full-size parameter from (seed, name) alone, so a rank can fill a shard without the rest.

    Norm weights start at one, routing biases (a mixture of experts' balance=bias) at zero; output
    projections (wo, w2, the experts' w2) are scaled down with depth as in GPT-2."""
    if name.endswith("norm.weight"):
        tensor.fill_(1.0)
        return
    if name.endswith("expert_bias"):
        tensor.zero_()
        return
    scale = std / math.sqrt(2 * n_layers) if name.endswith(("wo.weight", "w2.weight", "experts.w2")) else std
    gen = torch.Generator().manual_seed(param_seed(seed, name))
    if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous() \
            and not tensor.requires_grad:
        torch.randn(tensor.shape, generator=gen, out=tensor).mul_(scale)   # no full-size temporary
    else:
        tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * scale)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Initialise every parameter from a generator seeded by (seed, parameter name).

    Layout independence: a parameter's values depend only on the seed and its name, never
    on which other parameters a rank holds or in which order they are created.
    """
    n_layers = max(1, len(getattr(model, "layers", [])) or 1)
    if hasattr(model, "args"):
        n_layers, std = model.args.n_layers, model.args.init_std
    for name, p in model.named_parameters():
        init_parameter(p, name, seed, n_layers, std)
