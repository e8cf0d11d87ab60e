"""What a sampler yields for a batch: sequences of seq_len + 1 tokens (or fewer: one example a row) and what
travels beside them; and rows of examples padded to a common width, for every source of examples."""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

PAD_ID = 0      # the token of padding (never a trained target, never attended to from a real token)


class Rows(NamedTuple):
    """Sequences of seq_len + 1 tokens with what travels beside them: which tokens are trained targets
    (None: all) and each token's document number (None: no document mask). `lengths`: each row's own length
    where rows hold one example each (then a micro-batch is as wide as its longest; None: every row is full)."""
    tokens: torch.Tensor
    trained: Optional[torch.Tensor] = None
    documents: Optional[torch.Tensor] = None
    lengths: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.tokens)


def padded(examples: list[tuple[np.ndarray, np.ndarray]]) -> Rows:
    """Examples (token ids, 1 where a token is a trained target), one a row, padded after its end to the longest:
    the padding is never trained, and causal attention keeps it out of every real token's view, so the rows need
    no document numbers (data.document_mask holds without them; a document mask would only make every new width
    a new shape for the kernels that build it, flex_attention's compiled one on CUDA)."""
    lengths = np.fromiter((len(ids) for ids, _ in examples), dtype=np.int64, count=len(examples))
    width = int(lengths.max()) if len(lengths) else 0
    tokens = np.full((len(examples), width), PAD_ID, dtype=np.int64)
    trained = np.zeros((len(examples), width), dtype=bool)
    for r, (ids, mask) in enumerate(examples):
        tokens[r, :len(ids)] = ids
        trained[r, 1:len(ids)] = mask[1:] != 0      # the first token: nothing before it predicts it
    return Rows(torch.from_numpy(tokens), torch.from_numpy(trained), None, torch.from_numpy(lengths))


def cat_rows(rows: list) -> "Rows | torch.Tensor":
    """Rows of several sources (a mixture) as one: plain rows are all trained, in one document."""
    if all(isinstance(r, torch.Tensor) for r in rows):
        return torch.cat(rows)
    rows = [r if isinstance(r, Rows) else Rows(r) for r in rows]
    trained = None if all(r.trained is None for r in rows) else torch.cat(
        [r.trained if r.trained is not None else torch.ones_like(r.tokens, dtype=torch.bool) for r in rows])
    documents = None if all(r.documents is None for r in rows) else torch.cat(
        [r.documents if r.documents is not None else torch.zeros_like(r.tokens, dtype=torch.int32) for r in rows])
    return Rows(torch.cat([r.tokens for r in rows]), trained, documents)
