"""A GPT-2 style decoder: LayerNorm with bias, learned absolute position embeddings, a GELU (tanh)
MLP, biases in every linear, and the output head tied to the token embedding.

Layers live in a ModuleDict keyed by index (as in our Llama) so a pipeline stage keeps the full
model's parameter names. `wte`, `wpe`, `ln_f` and `lm_head` may be None on stages that do not hold
them; a stage holding `lm_head` without `wte` carries its own copy of the tied weight (the spec's
tied_parameters), kept equal to the first stage's by summing their gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from framework.models.documents import DocumentLayout, attend
from framework.models.loss import deferred_logits
from framework.models.positions import token_positions
from framework.models.seeding import param_seed


@dataclass
class GPT2Args:
    dim: int = 768                          # model width (embedding and residual stream)
    n_layers: int = 12                      # transformer blocks
    n_heads: int = 12                       # attention heads
    vocab_size: int = 50257                 # embedding rows; follows data.vocab_size unless set
    max_seq_len: int = 1024                 # learned position embeddings (the longest sequence)
    norm_eps: float = 1e-5                  # LayerNorm epsilon
    init_std: float = 0.02                  # standard deviation of the seeded normal init
    # training: the loss projects and upcasts this many tokens' logits at a time (framework/models/loss.py), 0 = all at once
    loss_chunk_tokens: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        return 4 * self.dim

    def num_params(self, include_embedding: bool = True) -> int:
        """From the shapes alone; the tied head adds nothing."""
        d, h = self.dim, self.hidden_dim
        attn = 4 * d * d + 4 * d
        mlp = 2 * d * h + h + d
        block = attn + mlp + 4 * d                      # two LayerNorms (weight and bias)
        n = self.n_layers * block + 2 * d               # + ln_f
        if include_embedding:
            n += self.vocab_size * d + self.max_seq_len * d
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """6N + 12*L*H*Q*T with N without the embeddings, plus the tied head's matmul (6 * V * d)."""
        return (6 * (self.num_params(include_embedding=False) + self.vocab_size * self.dim)
                + 12 * self.n_layers * self.n_heads * self.head_dim * seq_len)


class Attention(nn.Module):
    def __init__(self, args: GPT2Args):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.dim)
        self.wk = nn.Linear(args.dim, args.dim)
        self.wv = nn.Linear(args.dim, args.dim)
        self.wo = nn.Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1: under tensor parallelism each rank holds a slice of the heads
        q, k, v = (w(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = attend(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class MLP(nn.Module):
    def __init__(self, args: GPT2Args):
        super().__init__()
        self.fc = nn.Linear(args.dim, args.hidden_dim)
        self.proj = nn.Linear(args.hidden_dim, args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, args: GPT2Args):
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.attn = Attention(args)
        self.ln_2 = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.args = args = GPT2Args(**kwargs)
        self.wte: Optional[nn.Embedding] = nn.Embedding(args.vocab_size, args.dim)
        self.wpe: Optional[nn.Embedding] = nn.Embedding(args.max_seq_len, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.ln_f: Optional[nn.LayerNorm] = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.lm_head: Optional[nn.Linear] = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor, documents: Optional[torch.Tensor] = None) -> torch.Tensor:
        """tokens (batch, seq) of ids -> logits; on inner pipeline stages hidden states in and out. `documents`
        (batch, seq): packed documents' numbers (framework.models.documents)."""
        layout = DocumentLayout(documents) if documents is not None else None
        if self.wte is not None:
            positions = token_positions(tokens.shape[1], tokens.device) if layout is None else layout.positions
            h = self.wte(tokens) + self.wpe(positions)
        else:
            h = tokens
        for layer in self.layers.values():
            h = layer(h, None if layout is None else layout.mask)
        if self.ln_f is not None:
            h = self.ln_f(h)
        if self.lm_head is None:
            return h
        if self.training and self.args.loss_chunk_tokens:
            return deferred_logits(h, self.lm_head, self.args.loss_chunk_tokens)
        return self.lm_head(h).float()

    def block_classes(self) -> tuple[type, ...]:
        return (Block,)


#: the output head shares the token embedding: (canonical name, alias)
TIED = (("wte.weight", "lm_head.weight"),)


@torch.no_grad()
def init_parameter(tensor: torch.Tensor, name: str, seed: int, n_layers: int, std: float = 0.02) -> None:
    """GPT-2's init from (seed, name) alone: N(0, std) weights, zero biases, unit LayerNorm weights,
    residual output projections scaled by 1/sqrt(2 * n_layers); the tied head is the embedding."""
    name = dict((alias, canonical) for canonical, alias in TIED).get(name, name)
    if name.endswith(".bias"):
        tensor.zero_()
        return
    if "ln_" in name:
        tensor.fill_(1.0)
        return
    scale = std / math.sqrt(2 * n_layers) if name.endswith(("attn.wo.weight", "mlp.proj.weight")) else std
    gen = torch.Generator().manual_seed(param_seed(seed, name))
    tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * scale)
