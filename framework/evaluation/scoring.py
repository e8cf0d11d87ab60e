"""Per-token log-probabilities through a strategy's own `eval_loss`, under every layout, with no layout branch.

The targets handed to eval_loss are not token ids but codes,
    code = (row * W + position) * CODE_BASE + token          (IGNORE where a position is padding),
so the "loss function" that sees the logits (every rank without a pipeline, the last stage with one; a
context-parallel rank for its shard of positions; tensor-parallel ranks for the same rows) knows which (row,
position) of the whole batch each value belongs to, however the strategy split the rows over data-parallel ranks
and micro-batches, or the positions over context-parallel ranks. It adds log p and "is the argmax" into a buffer
of the whole batch with a count; one all_reduce(SUM) and a division leave the full [B, W] answer on every rank
(tensor-parallel duplicates average out, pipeline stages without logits add zeros). The loss it returns is 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

CODE_BASE = 1 << 20        # above any vocabulary; codes fit int64 while rows * W < 2**43
IGNORE = -100
CHUNK_TOKENS = 4096        # log_softmax over [tokens, vocabulary] this many tokens at a time


class Collector:
    """The loss_fn given to Strategy.eval_loss; `result()` after it: (logp, greedy) [rows, width], every rank."""

    def __init__(self, rows: int, width: int, device):
        self.rows, self.width = rows, width
        self.buf = torch.zeros(3, rows * width, dtype=torch.float64, device=device)   # logp, greedy, count

    def __call__(self, output: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        if hasattr(output, "full_tensor"):      # vocabulary-sharded (tensor-parallel) logits
            output = output.full_tensor()
        logits, codes = output.flatten(0, -2), codes.to(output.device).flatten()
        keep = codes >= 0
        logits, codes = logits[keep], codes[keep]
        for part in range(0, len(codes), CHUNK_TOKENS):
            chunk, code = logits[part:part + CHUNK_TOKENS].float(), codes[part:part + CHUNK_TOKENS]
            token, where = code % CODE_BASE, (code // CODE_BASE).to(self.buf.device)
            logp = torch.log_softmax(chunk, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
            self.buf[0].index_add_(0, where, logp.double().to(self.buf.device))
            self.buf[1].index_add_(0, where, (chunk.argmax(-1) == token).double().to(self.buf.device))
            self.buf[2].index_add_(0, where, torch.ones_like(logp, dtype=torch.float64, device=self.buf.device))
        return output.new_zeros((), dtype=torch.float32)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if dist.is_initialized():
            dist.all_reduce(self.buf)
        count = self.buf[2].clamp(min=1)
        logp = (self.buf[0] / count).view(self.rows, self.width).float().cpu()
        greedy = (self.buf[1] / count).view(self.rows, self.width).cpu() > 0.5
        return logp, greedy


def codes_of(targets: torch.Tensor) -> torch.Tensor:
    rows, width = targets.shape
    where = torch.arange(rows * width).view(rows, width)
    return torch.where(targets >= 0, where * CODE_BASE + targets.clamp(min=0), torch.full_like(targets, IGNORE))


def strategy_scorer(strategy, micro_batch: int):
    """score(inputs, targets) over the strategy: every rank calls it with the same [B, W] batch (B divisible by the
    data-parallel degree); each takes its data-parallel share of the rows, cut into micro-batches of
    `micro_batch` rows, as the trainer cuts an evaluation batch."""
    def score(inputs: torch.Tensor, targets: torch.Tensor):
        rows, width = inputs.shape
        share = rows // strategy.dp_size
        mine = slice(strategy.dp_rank * share, (strategy.dp_rank + 1) * share)
        local = list(zip(inputs[mine].split(micro_batch), codes_of(targets)[mine].split(micro_batch))) \
            if strategy.needs_batches else []
        collector = Collector(rows, width, strategy.device)
        strategy.eval_loss(local, collector)
        return collector.result()
    return score
