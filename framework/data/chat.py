"""Chat and instruction records -> token ids and a loss mask.

A record is a conversation: `messages` (a list of {role, content}), or `prompt` and `completion` (two strings:
one user turn and its answer; or two message lists). A conversation is rendered with a chat template -- the
tokenizer's own (the `chat_template` of its tokenizer_config.json, or chat_template.jinja beside it), else a
named built-in (TEMPLATES) -- through transformers' apply_chat_template, and tokenized as one text. The trained
tokens are found by rendering the conversation up to each assistant turn with the generation prompt and up
to the end of that turn: the characters between the two are the turn's answer and its end-of-turn marker.
A prompt/completion pair with no template at all is plain text: prompt, then completion and end-of-text,
trained.

data.train_on: `assistant` trains every assistant turn, `last` the last one only, `all` every token. The
first token of an example is never trained: nothing before it in its document predicts it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from framework.data.documents import DocumentError
from framework.data.tokenizer import CONFIG_FILE
from framework.errors import installed

TRAIN_ON = ("assistant", "all", "last")
ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True)
class BuiltinTemplate:
    jinja: str
    special_tokens: tuple[str, ...]     # tokens the template writes, which the tokenizer must hold
    end_of_turn: str
    bos_token: Optional[str] = None


TEMPLATES = {
    # Meta-Llama-3-8B-Instruct's own template
    "llama3": BuiltinTemplate(
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + "
        "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>",
        "<|begin_of_text|>"),
    "chatml": BuiltinTemplate(
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
}
# End-of-turn markers of common tokenizers' own templates: generation stops at any the tokenizer holds.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>")
RENDERER = ("transformers", "hf")     # what renders a chat template, and the extra that installs it


class ChatError(DocumentError):
    """A chat record or template that cannot be used; the message starts with `file[:line]`."""


class MissingRenderer(ChatError):
    """A chat template to render and no transformers to render it. `option` asked for the template:
    `chat_template` (a built-in, named) or `tokenizer` (the tokenizer's own); callers name it as they spell it."""

    def __init__(self, option: str):
        self.option = option
        package, extra = RENDERER
        super().__init__(f"chat templates are rendered by {package}, which is not installed: "
                         f"pip install 'framework[{extra}]'")

    def __reduce__(self):       # raised in a worker, pickled to the main process
        return MissingRenderer, (self.option,)


@dataclass(frozen=True)
class Example:
    where: str
    messages: Optional[list] = None          # a conversation for the template
    prompt: Optional[str] = None             # or a plain prompt/completion pair (no template)
    completion: Optional[str] = None


def is_chat_record(record, text_key: str) -> bool:
    """Whether a record is a conversation (messages, or prompt and completion) rather than a text document."""
    if not isinstance(record, dict):
        return False
    return isinstance(record.get(text_key), list) or isinstance(record.get("messages"), list) or \
        ("prompt" in record and "completion" in record)


def checked_messages(where: str, messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ChatError(f"{where}: the messages are {'empty' if messages == [] else 'not a list'}")
    out = []
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatError(f"{where}: message {i} has no role; each message is {{\"role\": ..., \"content\": ...}} "
                            f"with a role of {', '.join(ROLES)}")
        if m["role"] not in ROLES:
            raise ChatError(f"{where}: message {i} has role {m['role']!r}; use one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise ChatError(f"{where}: message {i} ({m['role']}) has no text content")
        if m["role"] == "assistant" and not m["content"].strip():
            raise ChatError(f"{where}: message {i} is an empty assistant turn; there is nothing to train on")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "assistant" for m in out):
        raise ChatError(f"{where}: no assistant turn to train on")
    return out


def example_of(where: str, record, text_key: str) -> Example:
    """The conversation of a chat record, checked: every message has a known role and text, every assistant
    turn says something, and there is one to train on."""
    if isinstance(record.get(text_key), list) or isinstance(record.get("messages"), list):
        key = text_key if isinstance(record.get(text_key), list) else "messages"
        return Example(where, messages=checked_messages(where, record[key]))
    prompt, completion = record.get("prompt"), record.get("completion")
    if isinstance(prompt, list) and isinstance(completion, list):
        return Example(where, messages=checked_messages(where, prompt + completion))
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise ChatError(f"{where}: 'prompt' and 'completion' must both be strings or both message lists")
    if not completion.strip():
        raise ChatError(f"{where}: the completion is empty; there is nothing to train on")
    return Example(where, prompt=prompt, completion=completion)


def contents(example: Example) -> list[str]:
    """The texts of an example (what a tokenizer trained on the data learns from)."""
    if example.messages is not None:
        return [m["content"] for m in example.messages]
    return [example.prompt, example.completion]


# ---- templates ------------------------------------------------------------------------------------------
def _token_text(value) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    return value.get("content") if isinstance(value, dict) else value


def own_template(tokenizer_spec: str) -> tuple[Optional[str], Optional[str]]:
    """(the chat template stored with a tokenizer.json or in an HF tokenizer dir -- tokenizer_config.json's
    `chat_template` (its "default" where it names several), else chat_template.jinja -- and the bos_token the
    template may write); (None, None) if it has none."""
    folder = tokenizer_spec if os.path.isdir(tokenizer_spec) else os.path.dirname(os.path.abspath(tokenizer_spec))
    config, found, bos = os.path.join(folder, CONFIG_FILE), None, None
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            settings = json.load(f)
        found, bos = settings.get("chat_template"), _token_text(settings.get("bos_token"))
        if isinstance(found, list):
            found = {t.get("name"): t.get("template") for t in found}.get("default")
    jinja = os.path.join(folder, TEMPLATE_FILE)
    if not (isinstance(found, str) and found) and os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            found = f.read()
    return (found, bos) if isinstance(found, str) and found else (None, None)


@dataclass(frozen=True)
class Template:
    jinja: Optional[str]                 # None: no template (plain prompt/completion pairs only)
    name: str                            # a built-in's name, or "tokenizer"
    bos_token: Optional[str] = None
    end_of_turn: Optional[str] = None


def choose_template(name: Optional[str], tokenizer_spec: str, own: bool) -> Template:
    """data.chat_template (a built-in's name), else the tokenizer's own, else none. `own`: the tokenizer is a
    user's file or dir, which may carry a template."""
    if name is not None:
        if name not in TEMPLATES:
            raise ChatError(f"{tokenizer_spec}: no chat template named {name!r}; use {' or '.join(TEMPLATES)}, "
                            f"or leave it unset for the tokenizer's own")
        t = TEMPLATES[name]
        return Template(t.jinja, name, t.bos_token, t.end_of_turn)
    jinja, bos = own_template(tokenizer_spec) if own else (None, None)
    return Template(jinja, "tokenizer" if jinja else "none", bos)


def check_renderer(template: Template) -> None:
    """Raise MissingRenderer where the template needs transformers and it is not installed: in the process
    that decides, before any worker would fail to build a Renderer."""
    if template.jinja is not None and not installed(RENDERER[0]):
        raise MissingRenderer("chat_template" if template.name in TEMPLATES else "tokenizer")


def fit_tokenizer(tok, template: Template, tokenizer_spec: str, ours: bool) -> None:
    """A tokenizer built here (bytes, bpe:N) gets a built-in template's special tokens; a user's must hold them."""
    if template.name not in TEMPLATES:
        return
    needed = TEMPLATES[template.name].special_tokens
    missing = [t for t in needed if tok.token_to_id(t) is None]
    if missing and ours:
        tok.add_special_tokens(list(missing))
    elif missing:
        raise ChatError(f"{tokenizer_spec}: the {template.name} chat template writes {missing[0]}, which this "
                        f"tokenizer lacks; use the tokenizer's own template (unset data.chat_template / "
                        f"--chat-template) or one whose tokens it holds ({', '.join(fitting_templates(tok)) or 'none'})")


def fitting_templates(tok) -> list[str]:
    return [name for name, t in TEMPLATES.items() if all(tok.token_to_id(s) is not None for s in t.special_tokens)]


def stop_tokens(tok, template: Template, eos_token: str) -> list[str]:
    """What ends an answer: the template's end of turn, any common one the tokenizer holds, and end-of-text."""
    names = [template.end_of_turn] if template.end_of_turn else []
    names += [t for t in END_OF_TURN if t not in names and tok.token_to_id(t) is not None]
    return names + ([eos_token] if eos_token not in names else [])


# ---- rendering -----------------------------------------------------------------------------------------
class Renderer:
    """Renders and tokenizes examples with one tokenizer and template (built once per prepare worker)."""

    def __init__(self, tokenizer_json: str, template: Template, bos_ids: list[int], eos_id: int):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_str(tokenizer_json)
        self.template, self.bos_ids, self.eos_id = template, bos_ids, eos_id
        self._hf = None
        if template.jinja is not None:
            check_renderer(template)
            from transformers import PreTrainedTokenizerFast
            specials = {"bos_token": template.bos_token} if template.bos_token else {}
            self._hf = PreTrainedTokenizerFast(tokenizer_object=self.tok, chat_template=template.jinja, **specials)

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self._hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, example: Example, train_on: str) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, 1 where the token is trained as a target)."""
        if example.messages is None and self._hf is None:
            return self._plain(example, train_on)
        if example.messages is None:
            messages = [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": example.completion}]
        else:
            messages = example.messages
        try:
            text, spans = self._spans(messages, train_on)
        except ChatError:
            raise
        except Exception as e:      # a template that does not render this conversation (jinja's raise_exception)
            raise ChatError(f"{example.where}: the chat template cannot render it ({str(e).splitlines()[0][:160]})") \
                from None
        encoded = self.tok.encode(text, add_special_tokens=False)
        starts = np.fromiter((a for a, _ in encoded.offsets), dtype=np.int64, count=len(encoded.ids))
        mask = np.zeros(len(encoded.ids), dtype=np.uint8)
        for a, b in spans:
            mask[(starts >= a) & (starts < b)] = 1
        if len(mask):
            mask[0] = 0
        return np.asarray(encoded.ids, dtype=np.uint32), mask

    def _spans(self, messages: list[dict], train_on: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans of its trained parts."""
        text = self.render(messages)
        if train_on == "all":
            return text, [(0, len(text))]
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if train_on == "last":
            turns = turns[-1:]
        spans = []
        for i in turns:
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (through.startswith(before) and text.startswith(through)):
                raise ChatError("the chat template renders a conversation's beginning differently from the whole "
                                "(it is not prefix-stable), so the assistant's tokens cannot be found")
            spans.append((len(before), len(through)))
        return text, spans

    def _plain(self, example: Example, train_on: str) -> tuple[np.ndarray, np.ndarray]:
        prompt = self.bos_ids + self.tok.encode(example.prompt, add_special_tokens=False).ids
        answer = self.tok.encode(example.completion, add_special_tokens=False).ids + [self.eos_id]
        mask = np.concatenate([np.full(len(prompt), train_on == "all", np.uint8), np.ones(len(answer), np.uint8)])
        if len(mask):
            mask[0] = 0
        return np.asarray(prompt + answer, dtype=np.uint32), mask
