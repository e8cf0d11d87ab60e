"""Context parallelism: each of cp ranks holds a load-balanced share of every sequence.

Sharding: a sequence is cut into 2 x cp equal chunks; rank r holds chunks r and 2cp-1-r, so under a
causal mask every rank attends over the same number of (query, key) pairs. Inputs and labels are
sharded alike (the labels are already shifted), and the shard's global positions are held in
framework.models.positions for RoPE and learned position embeddings.

Attention: within a step, every causal scaled_dot_product_attention call gathers the keys and values
of the whole sequence from the cp group (the backward sums their gradients back to their owners); each
of the rank's query chunks then attends to the keys up to its own end, causal aligned lower-right
(torch's CausalBias: no mask tensor on CUDA's kernels). This runs on any backend, gloo included. torch's own context-parallel SDPA
(torch.distributed.tensor.experimental.context_parallel) handles only the CUDA kernels (flash,
efficient, cuDNN), so it is not used here.

Loss: every rank holds seq_len / cp tokens of each sequence, so the mean over ranks of their local
mean losses is the loss of the unsplit sequence; gradients follow from FSDP's mean over dp x cp.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from framework.errors import ConfigError
from framework.models.positions import holding


def shard_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The global positions rank `rank` of `cp` holds, in the order it holds them."""
    chunk = seq_len // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


def gathered_positions(seq_len: int, cp: int) -> torch.Tensor:
    """The global positions of the rank-ordered concatenation of every rank's shard."""
    return torch.cat([shard_positions(seq_len, cp, r) for r in range(cp)])


def shard(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s share of `x` along the sequence dim `dim`."""
    return x.index_select(dim, shard_positions(x.shape[dim], cp, rank).to(x.device))


def unshard(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The inverse of shard: every rank's share (in rank order) back in sequence order."""
    joined = torch.cat(shards, dim)
    order = torch.argsort(gathered_positions(joined.shape[dim], len(shards))).to(joined.device)
    return joined.index_select(dim, order)


def causal_biases(q_positions: torch.Tensor, chunk: int) -> list:
    """For each query chunk of `chunk` consecutive positions, torch's lower-right causal bias over the keys
    up to the chunk's end. Made before a step, not inside it: a tensor subclass cannot be created under
    selective checkpointing's dispatch mode."""
    from torch.nn.attention.bias import causal_lower_right   # imports torch._dynamo (~1 s): not for a config refused before work
    return [causal_lower_right(chunk, int(q_positions[i]) + chunk) for i in range(0, len(q_positions), chunk)]


def chunked_causal_attention(q, k, v, q_positions: torch.Tensor, chunk: int, biases: list | None = None,
                             **kwargs) -> torch.Tensor:
    """Causal attention of queries (batch, heads, seq, dim) at q_positions, which run in whole chunks of
    `chunk` consecutive positions, over keys/values of the whole sequence in position order (`biases`:
    causal_biases of the same positions, made once)."""
    biases = causal_biases(q_positions, chunk) if biases is None else biases
    outs = []
    for part, bias in zip(q.split(chunk, dim=2), biases):
        end = bias.seq_len_kv
        outs.append(F.scaled_dot_product_attention(part, k[:, :, :end], v[:, :, :end], attn_mask=bias, **kwargs))
    return torch.cat(outs, dim=2)


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 (batch, heads, seq, head_dim) in rank order; the backward reduce-scatters
    the gradients of every rank's copy back to their owner. (Both collectives work on dim 0: the
    sequence dim is moved there and back.)"""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, size = group, dist.get_world_size(group)
        local = x.movedim(2, 0).contiguous()
        out = local.new_empty((size * local.shape[0], *local.shape[1:]))
        dist.all_gather_into_tensor(out, local, group=group)
        return out.movedim(0, 2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.movedim(2, 0).contiguous()
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad, group=ctx.group)
        return out.movedim(0, 2), None


class GatheredAttention(TorchFunctionMode):
    """Routes causal scaled_dot_product_attention through chunked_causal_attention over the keys and
    values that `gather` returns for the whole sequence (held at `all_positions`; one process: the
    identity) put back in position order."""

    def __init__(self, gather, positions: torch.Tensor, all_positions: torch.Tensor, chunk: int):
        super().__init__()
        self.gather, self.positions, self.chunk = gather, positions, chunk
        self.order = torch.argsort(all_positions)
        self.biases = causal_biases(positions, chunk)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention or not kwargs.get("is_causal"):
            return func(*args, **kwargs)
        q, k, v = args[:3]
        if q.device.type == "meta":     # pipeline shape inference: no data, no collectives
            return func(*args, **kwargs)
        kwargs.pop("is_causal")
        order = self.order.to(q.device)
        k, v = (self.gather(t).index_select(2, order) for t in (k, v))
        return chunked_causal_attention(q, k, v, self.positions, self.chunk, self.biases, **kwargs)


class ContextParallel:
    """One rank's view of its cp group: shards batches and holds the attention and positions for a step."""

    def __init__(self, group, seq_len: int):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.positions = shard_positions(seq_len, self.size, self.rank)
        self.all_positions = gathered_positions(seq_len, self.size)
        self.chunk = seq_len // (2 * self.size)

    def shard_batch(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(shard(t, self.size, self.rank, dim=1) for t in tensors)

    @contextlib.contextmanager
    def step(self):
        """Forward and backward of a step (recomputation included) run inside this."""
        gather = lambda t: _GatherSequence.apply(t, self.group)     # noqa: E731
        with holding(self.positions), GatheredAttention(gather, self.positions, self.all_positions, self.chunk):
            yield


def check_context_parallel(cfg, cp: int, tp: int) -> None:
    """The rules parallel.cp puts on the sequence length (one line, before any worker starts)."""
    if cp < 1:
        raise ConfigError("parallel.cp", f"must be a positive degree, got {cp}")
    if cp == 1:
        return
    if cfg.data.document_mask:
        raise ConfigError("data.document_mask", f"parallel.cp={cp} does not split document-masked attention yet; "
                                                f"set one of them off")
    seq_len = cfg.data.seq_len
    if cfg.trainer.sample_every:
        raise ConfigError("trainer.sample_every", f"a text sample reads the logits of one position, which "
                                                  f"parallel.cp={cp} splits across ranks; set "
                                                  f"trainer.sample_every=0 or parallel.cp=1")
    if seq_len % (2 * cp):
        raise ConfigError("parallel.cp", f"data.seq_len={seq_len} does not split into 2 x cp = {2 * cp} equal "
                                         f"chunks (each rank holds two, from opposite ends); use a seq_len "
                                         f"divisible by {2 * cp} or another cp")
    if cfg.parallel.sequence_parallel and (seq_len // cp) % tp:
        raise ConfigError("parallel.cp", f"sequence parallelism splits a cp rank's {seq_len // cp} positions "
                                         f"(data.seq_len {seq_len} / cp {cp}) among parallel.tp={tp} ranks: not "
                                         f"divisible; use a seq_len divisible by cp x tp = {cp * tp}")
