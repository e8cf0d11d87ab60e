"""Llama with a mixture of experts for each block's feed-forward (Mixtral / Qwen3-MoE / DeepSeek-V3 shaped).

A variant of our Llama, not a copy: MoETransformer is Llama with its arguments (MoEArgs) and two parts
swapped, the feed-forward (a router plus E SwiGLU experts) and, for Qwen3, the attention (per-head q/k
norms); the top level, rotary tables, the chunked loss, the TP plan and pipeline split are Llama's.
Every token goes to its top-k experts (softmax or sigmoid scores, the chosen weights renormalised to sum
to one as HF's classes do), plus an optional shared expert every token passes through. Dispatch is
dropless: tokens are sorted by expert and each expert computes all of its tokens (no capacity, nothing
dropped).

Balancing (balance.py): `balance=aux_loss` adds the Switch/Mixtral auxiliary loss to the gradient,
`balance=bias` moves a per-expert routing bias outside the gradient (DeepSeek-V3's auxiliary-loss-free
rule), `none` does neither. Expert weights are 3-D parameters (experts, out, in) so expert parallelism
can shard dim 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from framework.models.llama.model import Attention, FeedForward, Llama, LlamaArgs, RMSNorm
from framework.models.moe import balance
from framework.models.moe.experts import expert_swiglu

SCORE_FUNCS = ("softmax", "sigmoid")
BALANCES = ("aux_loss", "bias", "none")
EXPERT_COMPUTE = ("auto", "grouped_mm", "loop")


@dataclass
class MoEArgs(LlamaArgs):
    n_experts: int = 8                      # routed experts per MoE layer
    top_k: int = 2                          # experts each token is sent to
    moe_ffn_dim: int = 128                # hidden size of one routed expert
    shared_ffn_dim: int = 0               # hidden size of the shared expert; 0 = none
    score_func: str = "softmax"             # router scores: softmax | sigmoid
    norm_topk_prob: bool = True           # renormalise the k chosen weights to sum to one
    balance: str = "aux_loss"               # aux_loss (Switch/Mixtral) | bias (DeepSeek-V3's loss-free routing bias) | none
    aux_loss_coef: float = 0.01             # balance=aux_loss: weight of the auxiliary loss
    bias_update_rate: float = 0.001       # balance=bias: how far a step moves an expert's bias
    expert_compute: str = "auto"          # auto | grouped_mm | loop; auto: torch._grouped_mm where the device has it
    attn_head_dim: Optional[int] = None   # None = dim / n_heads; Qwen3 sets 128 with dim 2048 and 32 heads
    qk_norm: bool = False                 # Qwen3: RMSNorm over each head's q and k before RoPE

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.dim // self.n_heads

    def _dense_params(self) -> int:
        """Everything but the routed experts, per the Llama count with the MLP swapped for router + shared."""
        d = self.dim
        attn = 2 * d * self.n_heads * self.head_dim + 2 * d * self.kv_heads * self.head_dim
        attn += 2 * self.head_dim if self.qk_norm else 0
        block = attn + (d + 1) * self.n_experts + 3 * d * self.shared_ffn_dim + 2 * d   # router + its bias
        return self.n_layers * block + d

    def expert_params(self) -> int:
        """Parameters of all routed experts together."""
        return self.n_layers * self.n_experts * 3 * self.dim * self.moe_ffn_dim

    def num_params(self, include_embedding: bool = True) -> int:
        emb = self.vocab_size * self.dim
        n = self._dense_params() + self.expert_params() + (emb if self.tie_embeddings else 2 * emb)
        return n - emb if not include_embedding else n

    def active_params(self, include_embedding: bool = True) -> int:
        """Parameters one token meets: k of the E routed experts."""
        return self.num_params(include_embedding) - self.expert_params() * (self.n_experts - self.top_k) // self.n_experts

    def flops_per_token(self, seq_len: int) -> float:
        """6 x active parameters (no embedding lookup) + the attention term: what MFU counts."""
        return 6 * self.active_params(include_embedding=False) + \
            12 * self.n_layers * self.n_heads * self.head_dim * seq_len


class Router(nn.Module):
    """Scores every expert for every token and picks the top k. `expert_bias` (balance=bias) shifts only
    which experts are chosen, never the weights their outputs are mixed with."""

    def __init__(self, args: MoEArgs):
        super().__init__()
        self.args = args
        self.gate = nn.Linear(args.dim, args.n_experts, bias=False)
        # a parameter without gradient (not a buffer) so sharded layouts materialise and checkpoint it by name
        self.expert_bias = nn.Parameter(torch.zeros(args.n_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (tokens, dim) -> (scores (tokens, E) fp32, weights (tokens, k), expert ids (tokens, k))."""
        logits = self.gate(x).float()
        scores = logits.softmax(-1) if self.args.score_func == "softmax" else logits.sigmoid()
        choice = scores + self.expert_bias.float() if self.args.balance == "bias" else scores
        ids = choice.topk(self.args.top_k, dim=-1).indices
        weights = scores.gather(-1, ids)
        if self.args.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return scores, weights, ids


class Experts(nn.Module):
    """E SwiGLU experts as 3-D weights (expert, out, in): w1 gate, w3 up, w2 down (Llama's names)."""

    def __init__(self, args: MoEArgs):
        super().__init__()
        e, d, h = args.n_experts, args.dim, args.moe_ffn_dim
        self.compute = args.expert_compute
        self.w1 = nn.Parameter(torch.empty(e, h, d))
        self.w3 = nn.Parameter(torch.empty(e, h, d))
        self.w2 = nn.Parameter(torch.empty(e, d, h))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x (tokens sorted by expert, dim), counts (E,) tokens per expert -> (tokens, dim)."""
        return expert_swiglu(x, counts, self.w1, self.w3, self.w2, self.compute)


class MoEFeedForward(nn.Module):
    def __init__(self, args: MoEArgs, layer_id: int):
        super().__init__()
        self.args, self.layer_id = args, layer_id
        self.router = Router(args)
        self.experts = Experts(args)
        self.shared_expert: Optional[FeedForward] = (FeedForward(args.dim, args.shared_ffn_dim)
                                                     if args.shared_ffn_dim else None)
        #: where dispatch sends tokens and combine brings them back (expert parallelism swaps it)
        self.dispatcher = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores, weights, ids = self.router(x)
        # scatter_add, not bincount: a fixed output shape, which the planner's fake-tensor pass needs
        counts = torch.zeros(self.args.n_experts, dtype=torch.long, device=x.device).scatter_add_(
            0, ids.flatten(), torch.ones_like(ids.flatten()))
        aux = balance.observe(self, scores, counts)
        # dropless dispatch: each (token, choice) pair in expert order, stable so equal ids keep token order
        order = ids.flatten().argsort(stable=True)
        token_of = order // self.args.top_k
        routed = x[token_of]
        if self.dispatcher is None:
            out = self.experts(routed, counts)
        else:
            out = self.dispatcher(routed, counts, self.experts)
        out = out * weights.flatten()[order].unsqueeze(-1).to(out.dtype)
        y = torch.zeros_like(x).index_add_(0, token_of, out.to(x.dtype))
        if self.shared_expert is not None:
            y = y + self.shared_expert(x)
        return balance.with_aux_loss(y.reshape(shape), aux, self.args.aux_loss_coef)


class QKNormAttention(Attention):
    """Llama's attention; with `qk_norm` each head's q and k pass an RMSNorm over head_dim before RoPE
    (Qwen3). Without it the parameters and numbers are Llama's."""

    def __init__(self, args: MoEArgs):
        super().__init__(args)
        self.q_norm = RMSNorm(self.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.norm_eps) if args.qk_norm else None

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.q_norm is None:
            return q, k
        return self.q_norm(q), self.k_norm(k)


class MoETransformer(Llama):
    args_class = MoEArgs

    def attention(self, args: MoEArgs, layer_id: int) -> nn.Module:
        return QKNormAttention(args)

    def feed_forward(self, args: MoEArgs, layer_id: int) -> nn.Module:
        return MoEFeedForward(args, layer_id)
