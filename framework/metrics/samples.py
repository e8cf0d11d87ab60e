"""trainer.sample_every: a short continuation of trainer.sample_prompt, logged at those steps.

Every rank must take part in each forward (FSDP gathers parameters, pipeline stages pass activations),
so each new token goes through the Strategy's own eval_loss, with a "loss" that is the sampled token id:
the ranks that see the logits draw the same id from a generator seeded by (seed, step, position), and
the mean that eval_loss reduces over ranks is that id on every rank, whatever the strategy.
"""
from __future__ import annotations

import torch

from framework.data.tokenizer import TokenizerError, bos_ids, eos_token
from framework.models.sampling import next_token

TEMPERATURE, TOP_K = 0.8, 50


def start_tokens(tokenizer, prompt: str) -> list[int]:
    """The tokens a sample continues: the prompt's; where it encodes to none, those a prepared dataset's documents
    start after (framework.data.prepare writes BOS + text + end-of-text): the tokenizer's BOS where it puts one
    before a text, else its end-of-text token; [] where it has neither. Validation refuses a start outside the
    data's vocabulary (byte-level data holds bytes only, not the byte tokenizer's end-of-text token)."""
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    if ids:
        return ids
    if bos := bos_ids(tokenizer):
        return bos
    try:
        return [eos_token(tokenizer)[1]]
    except TokenizerError:
        return []


class TextSampler:
    def __init__(self, tokenizer, prompt: str, new_tokens: int, seq_len: int, rows: int, seed: int):
        self.tokenizer, self.new_tokens, self.seq_len, self.rows, self.seed = tokenizer, new_tokens, seq_len, rows, seed
        try:
            self.eos_id = eos_token(tokenizer)[1]
        except TokenizerError:
            self.eos_id = None
        self.prompt = start_tokens(tokenizer, prompt)
        self._tokens: list[int] = []
        self._step = 0

    def local_batch(self, step: int, dp_rank: int, dp_size: int) -> torch.Tensor:
        """The current window, right-padded to the training shape, once per row of this rank's share
        (pipelines need the shapes they were built for; causal attention ignores the padding)."""
        window = self._tokens[-self.seq_len:]
        row = torch.zeros(self.seq_len + 1, dtype=torch.long)
        row[:len(window)] = torch.tensor(window)
        return row.expand(self.rows // dp_size, -1).clone()

    def pick(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if hasattr(logits, "full_tensor"):   # vocabulary-sharded (tensor parallel) logits
            logits = logits.full_tensor()
        position = min(len(self._tokens), self.seq_len) - 1
        generator = torch.Generator().manual_seed(hash((self.seed, self._step, len(self._tokens))) & (2**63 - 1))
        token = next_token(logits[0, position].detach().cpu(), TEMPERATURE, TOP_K, generator)
        return torch.tensor(float(token), device=logits.device)

    def run(self, step: int, eval_loss) -> str:
        """eval_loss(self) runs one forward of every rank through the strategy and returns the mean of pick()."""
        self._step, self._tokens = step, list(self.prompt)
        for _ in range(self.new_tokens):
            token = round(float(eval_loss(self)))
            if token == self.eos_id:
                break
            self._tokens.append(token)
        return self.tokenizer.decode(self._tokens)
