"""lm-eval's TemplateLM over a framework model, whichever way its forwards run.

The model side is one callable, `score(inputs, targets) -> (logp, greedy)`: LongTensor [B, W] rows in, float
[B, W] log p(target) and bool [B, W] "target is the argmax" out, the same on every rank. A model in this
process: `forward_scorer(model)`; inside a training job: `scoring.strategy_scorer`, which every layout serves.
This class decides the requests' cutting, padding and order, as lm-eval's own HFLM does
(lm_eval/models/huggingface.py `_loglikelihood_tokens`), so the two give the same numbers on the same weights.
"""
from __future__ import annotations

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from framework.data.tokenizer import TokenizerError, bos_ids, eos_token

PAD = 0     # a right-padded position is never read (causal attention) and its target is ignored
IGNORE = -100


def forward_scorer(model):
    """score() of a module in this process that returns logits [B, W, V]."""
    @torch.no_grad()
    def score(inputs: torch.Tensor, targets: torch.Tensor):
        logits = model(inputs).float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return logp, logits.argmax(-1) == targets
    return score


def prefix_for(tok, vocab_size: int) -> int:
    """The token an empty context starts from: BOS where the tokenizer adds one, else EOS where the model has it
    in its vocabulary, else the newline token (byte models: EOS 256 lies outside a 256-entry vocabulary). An
    HFLM compared with this one is given the same (`prefix_token_id`)."""
    bos = bos_ids(tok)
    if bos:
        return bos[0]
    try:
        eos = eos_token(tok)[1]
    except TokenizerError:
        eos = None
    if eos is not None and eos < vocab_size:
        return eos
    return tok.encode("\n", add_special_tokens=False).ids[0]


class FrameworkLM(TemplateLM):
    """`tok`: a `tokenizers.Tokenizer` (what a checkpoint records). Every batch is `batch_size` requests; with
    `width`, every batch is exactly [batch_size, width] (padded rows and columns: the shape a training job's
    pipeline schedule and context parallelism are built for); without, as wide as its longest request.
    `chat`: the chat template the run trained with ({"chat_template", "bos_token"?}), for apply_chat_template."""

    def __init__(self, score, tok, max_length: int, prefix_token_id: int, batch_size: int,
                 width: int | None = None, chat: dict | None = None):
        super().__init__()
        self.score, self.tok, self.max_length, self._prefix = score, tok, max_length, prefix_token_id
        self.batch_size, self.width, self.chat = batch_size, width, chat or {}
        self.forwards = 0

    # lm-eval sees one process: in a job every rank runs the same requests, and the strategy splits each batch's
    # rows over the data-parallel ranks (lm-eval's own split by rank would be wrong under tensor or pipeline
    # parallelism, whose ranks share rows)
    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def eot_token_id(self) -> int:
        return self._prefix

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # None: the tokenizer's own post-processor, except where the text already starts with the prefix token's
        # text (as HFLM.tok_encode does through transformers)
        if add_special_tokens is None and string.startswith(self.tok.decode([self._prefix])):
            add_special_tokens = False
        return self.tok.encode(string, add_special_tokens=add_special_tokens is not False).ids

    def _cut(self, context: list[int], continuation: list[int]):
        """(inputs, targets, scored count): the last max_length + 1 tokens of context + continuation, as HFLM."""
        whole = (context + continuation)[-(self.max_length + 1):]
        return whole[:-1], whole[1:], len(continuation)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        rows = [self._cut(context, continuation) for _, context, continuation in requests]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))   # longest first: fewer padded columns
        results: list = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            n_rows = self.batch_size if self.width else len(batch)
            width = self.width or max(len(rows[i][0]) for i in batch)
            inputs = torch.full((n_rows, width), PAD, dtype=torch.long)
            targets = torch.full((n_rows, width), IGNORE, dtype=torch.long)
            for r, i in enumerate(batch):
                inputs[r, :len(rows[i][0])] = torch.tensor(rows[i][0])
                targets[r, :len(rows[i][1])] = torch.tensor(rows[i][1])
            logp, greedy = self.score(inputs, targets)
            self.forwards += 1
            for r, i in enumerate(batch):
                scored = slice(len(rows[i][1]) - rows[i][2], len(rows[i][1]))
                results[i] = (float(logp[r, scored].double().sum()), bool(greedy[r, scored].all()))
        for (key, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text in disjoint windows of max_length tokens, as HFLM (lm_eval.utils' window functions)."""
        windows, owner = [], []
        for n, request in enumerate(requests):
            (text,) = request.args
            for window in lm_utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                             prefix_token=self.prefix_token_id,
                                                             max_seq_len=self.max_length, context_len=1):
                windows.append((None, *lm_utils.make_disjoint_window(window)))
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (logp, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[n] += logp
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("generative tasks are refused before an evaluation starts (tasks.py)")

    # chat models: the template the run trained with, rendered as framework.generate renders a turn
    @property
    def tokenizer_name(self) -> str:
        return "framework"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.chat.get("chat_template") if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """As HFLM.apply_chat_template, through transformers' renderer over our tokenizer object."""
        if not hasattr(self, "_renderer"):
            from transformers import PreTrainedTokenizerFast
            self._renderer = PreTrainedTokenizerFast(
                tokenizer_object=self.tok, chat_template=self.chat["chat_template"],
                **({"bos_token": self.chat["bos_token"]} if self.chat.get("bos_token") else {}))
        return self._renderer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)
