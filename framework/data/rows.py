"""What a sampler yields for a batch: sequences of seq_len + 1 tokens and what travels beside them."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class Rows(NamedTuple):
    """Sequences of seq_len + 1 tokens with what travels beside them: which tokens are trained targets
    (None: all) and each token's document number (None: no document mask)."""
    tokens: torch.Tensor
    trained: Optional[torch.Tensor] = None
    documents: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.tokens)


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
