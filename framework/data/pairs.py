"""Preference records -> token ids and completion masks, as TRL 1.16's DPOTrainer tokenizes them
(trl/trainer/dpo_trainer.py `_prepare_dataset`, :1036-1142).

A record is TRL's preference format: `prompt`, `chosen` and `rejected`, all plain strings or all conversations
(message lists: the prompt the turns so far, chosen and rejected the answers); or only `chosen` and `rejected`,
two conversations whose shared first messages are the prompt (TRL's implicit prompt, `extract_prompt`).

* plain strings: chosen and rejected end with the tokenizer's end-of-text (appended unless there); the prompt, the
  prompt + chosen and the prompt + rejected are each tokenized whole, with the tokenizer's special tokens (a BOS);
* conversations: the prompt is rendered with the generation prompt, prompt + chosen and prompt + rejected whole,
  with the chat template the SFT path uses (framework/data/chat.py), and tokenized as text;
* the completion starts where the prompt's ids and each whole sequence's part ways: the shorter of the two common
  prefixes, so a merge across the boundary (BPE) lands in the completion, as TRL does.

A pair is two examples, chosen then rejected, each the same prompt and its completion, the completion trained.
What data.seq_len and data.max_prompt_length cut is decided when the rows are built (framework/data/examples.py
`Pairs`), so one prepared dataset serves every length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from framework.data.chat import ChatError, checked_messages

KEYS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PairRecord:
    where: str
    prompt: object          # a string, or a message list
    chosen: object
    rejected: object

    @property
    def conversation(self) -> bool:
        return isinstance(self.chosen, list)


def is_pair_record(record) -> bool:
    return isinstance(record, dict) and ("chosen" in record or "rejected" in record)


def _shared_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pair_of(where: str, record) -> PairRecord:
    """The record's pair, checked: both answers present and different, all three parts of one kind."""
    if not isinstance(record, dict):
        raise ChatError(f"{where}: not a preference record: give 'prompt', 'chosen' and 'rejected'")
    for key in ("chosen", "rejected"):
        if record.get(key) in (None, "", []):
            raise ChatError(f"{where}: no '{key}'; a preference record has 'prompt', 'chosen' and 'rejected'")
    prompt, chosen, rejected = record.get("prompt"), record["chosen"], record["rejected"]
    if prompt is None:
        if not (isinstance(chosen, list) and isinstance(rejected, list)):
            raise ChatError(f"{where}: no 'prompt'; only conversations may carry it as their shared first messages")
        n = _shared_prefix(chosen, rejected)
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    if chosen == rejected:
        raise ChatError(f"{where}: 'chosen' and 'rejected' are identical; the pair teaches nothing")
    if all(isinstance(x, str) for x in (prompt, chosen, rejected)):
        return PairRecord(where, prompt, chosen, rejected)
    if not all(isinstance(x, list) for x in (prompt, chosen, rejected)):
        raise ChatError(f"{where}: 'prompt', 'chosen' and 'rejected' must all be strings or all message lists")
    if not chosen or not rejected:
        raise ChatError(f"{where}: 'chosen' or 'rejected' is only the conversation's shared beginning")
    for part in (chosen, rejected):
        if not any(m.get("role") == "assistant" for m in part if isinstance(m, dict)):
            raise ChatError(f"{where}: 'chosen' and 'rejected' must each hold an assistant turn")
    checked = checked_messages(where, prompt + chosen), checked_messages(where, prompt + rejected)
    p = len(prompt)
    return PairRecord(where, checked[0][:p], checked[0][p:], checked[1][p:])


def contents(pair: PairRecord) -> list[str]:
    """Its texts (what a tokenizer trained on the data learns from)."""
    parts = (pair.prompt, pair.chosen, pair.rejected)
    return [m["content"] for part in parts for m in part] if pair.conversation else list(parts)


def encode_pair(pair: PairRecord, renderer) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """([chosen ids, rejected ids], [their masks: 1 on the completion's tokens]) with a framework/data/chat.py
    Renderer (its tokenizer, template and end-of-text)."""
    tok = renderer.tok
    if pair.conversation:
        if renderer.template.jinja is None:
            raise ChatError(f"{pair.where}: a conversation needs a chat template, and the tokenizer has none; name "
                            f"a built-in one (data.chat_template)")
        texts = [renderer.render(pair.prompt, add_generation_prompt=True), renderer.render(pair.prompt + pair.chosen),
                 renderer.render(pair.prompt + pair.rejected)]
        special = False
    else:
        eos = tok.id_to_token(renderer.eos_id)
        ends = [a if a.endswith(eos) else a + eos for a in (pair.chosen, pair.rejected)]
        texts = [pair.prompt, pair.prompt + ends[0], pair.prompt + ends[1]]
        special = True
    prompt, *whole = (tok.encode(t, add_special_tokens=special).ids for t in texts)
    start = min(_shared_prefix(prompt, w) for w in whole)
    ids = [np.asarray(w, dtype=np.uint32) for w in whole]
    masks = [np.concatenate([np.zeros(start, np.uint8), np.ones(len(w) - start, np.uint8)]) for w in whole]
    return ids, masks
