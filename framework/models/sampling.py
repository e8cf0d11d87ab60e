"""One next token from a model's last-position logits: what generation and the trainer's text samples draw."""
from __future__ import annotations

import torch


def next_token(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> int:
    """One id from last-position logits: argmax at temperature 0, else top-k sampling."""
    logits = logits.float()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
