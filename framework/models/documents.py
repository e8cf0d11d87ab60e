"""Packed documents in one sequence: each token attends only within its own document, and its position
restarts at the document's start.

A forward that packs documents takes `documents`, a (batch, seq) integer tensor numbering each token's
document (any numbering: a new document starts where the number changes). From it a model builds one
`DocumentLayout` a forward: the positions (for RoPE tables or position embeddings) and the block-causal
attention every layer uses. On CUDA that is flex_attention with a document BlockMask (compiled once, it skips
the blocks no query may see); elsewhere scaled_dot_product_attention with the dense (seq x seq) boolean mask,
which CPU kernels take directly. Both compute the same function: causal attention restricted to the document.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_compiled_flex = None


def positions_in_documents(documents: torch.Tensor) -> torch.Tensor:
    """(batch, seq) positions counted from each token's document start."""
    seq = documents.shape[-1]
    index = torch.arange(seq, device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[..., 1:] = documents[..., 1:] != documents[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - first


def _flex(compiled: bool):
    """flex_attention: compiled on CUDA (its kernels); eager elsewhere, where it runs as a reference only."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class DocumentLayout:
    """The documents of one forward: positions, and causal attention within each document."""

    def __init__(self, documents: torch.Tensor, use_flex: bool | None = None):
        self.documents = documents
        self.positions = positions_in_documents(documents)
        self.use_flex = documents.is_cuda if use_flex is None else use_flex
        seq = documents.shape[-1]
        if self.use_flex:
            from torch.nn.attention.flex_attention import create_block_mask
            docs = documents

            def same_document_causal(b, h, q, k):
                return (docs[b, q] == docs[b, k]) & (q >= k)
            self.mask = create_block_mask(same_document_causal, documents.shape[0], None, seq, seq,
                                          device=documents.device)
        else:
            causal = torch.ones(seq, seq, dtype=torch.bool, device=documents.device).tril()
            self.mask = ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """A per-position table's rows (RoPE cos/sin: (max_seq, d)) for every token: (batch, seq, d)."""
        return table[self.positions]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, enable_gqa: bool = False) -> torch.Tensor:
    """q, k, v (batch, heads, seq, head_dim): causal attention, within documents where `mask` (a
    DocumentLayout's) is given."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
    return _flex(q.is_cuda)(q, k, v, block_mask=mask, enable_gqa=enable_gqa)
