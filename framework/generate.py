"""`python -m framework.generate <checkpoint step dir | export dir> --prompt TEXT`: print a continuation.

    python -m framework.generate outputs/run/checkpoints/step_00000200 --prompt "def " --max-new-tokens 100

Reads the weights of any strategy's checkpoint (or an export dir), the tokenizer recorded beside them,
and samples with temperature and top-k from a torch.Generator seeded by --seed: the same seed prints the
same text. --temperature 0 is greedy. Unusable input exits 2 with one `error:` line.

A model trained on chat data (its checkpoint records the chat template) answers: the prompt is a user turn
rendered with that template and the generation prompt, and the printed answer ends at the end of the turn.
--raw continues the prompt as plain text instead. An export of a LoRA run without --merge is its base weights
plus adapter/, which generate applies as the checkpoint's own model does.

The checkpoint's config.yaml is read as data (framework/config/saved.py): it names no code to run unless
--trust-checkpoint-code allows its model._target_.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from framework.export.load import LoadError as GenerateError, load
from framework.models.sampling import next_token


@torch.no_grad()
def sample(model, ids: list[int], max_new_tokens: int, temperature: float = 0.8, top_k: int = 50,
           seed: int = 0, eos_id: int | None = None, window: int | None = None,
           stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Continue `ids` token by token (the last `window` tokens each time: these models are small), until
    `eos_id` or one of `stop_ids`."""
    generator = torch.Generator().manual_seed(seed)
    tokens = list(ids)
    window = window or getattr(model, "context_length", None)
    for _ in range(max_new_tokens):
        next_id = next_token(model(torch.tensor([tokens[-window:]]))[0, -1], temperature, top_k, generator)
        if next_id == eos_id or next_id in stop_ids:
            break
        tokens.append(next_id)
    return tokens[len(ids):]


def _eos_id(tok) -> int | None:
    from framework.data.tokenizer import TokenizerError, eos_token
    try:
        return eos_token(tok)[1]
    except TokenizerError:
        return None


def continuation(model, tok, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
    eos_id = _eos_id(tok)
    ids = tok.encode(prompt, add_special_tokens=False).ids or ([eos_id] if eos_id is not None else [0])
    return tok.decode(sample(model, ids, max_new_tokens, temperature, top_k, seed, eos_id))


def answer(model, tok, chat: dict, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int,
           system: str | None = None, where: str = "the chat template") -> str:
    """The assistant's answer to `prompt` as a user turn, in the chat template the model was trained with
    (`where`: the file that holds it, for an error)."""
    from framework.data.chat import END_OF_TURN
    ids = tok.encode(rendered_turn(tok, chat, prompt, system, where), add_special_tokens=False).ids
    stops = tuple(i for i in (tok.token_to_id(t) for t in END_OF_TURN) if i is not None)
    return tok.decode(sample(model, ids, max_new_tokens, temperature, top_k, seed, _eos_id(tok), stop_ids=stops))


def rendered_turn(tok, chat: dict, prompt: str, system: str | None = None, where: str = "the chat template") -> str:
    """`prompt` as a user turn (after `system`'s message) and the generation prompt, in the chat template;
    GenerateError for a template that does not compile or render (transformers renders it in Jinja's sandbox)."""
    from jinja2 import TemplateError
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat["chat_template"],
                                 **({"bos_token": chat["bos_token"]} if chat.get("bos_token") else {}))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    try:
        return hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise GenerateError(f"{where}: chat_template: cannot be rendered ({type(e).__name__}: "
                            f"{first[:200]}); --raw continues the prompt as plain text") from None


def main(argv: list[str] | None = None) -> int:
    from framework.config.saved import TRUST_FLAG, TRUST_HELP
    parser = argparse.ArgumentParser(prog="python -m framework.generate",
                                     description="Continue a prompt with a trained model.")
    parser.add_argument("path", help="a checkpoint step dir, or a `python -m framework.export` dir (a LoRA run's "
                                     "export: with its adapter/ applied)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=50, help="0 = the whole vocabulary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true",
                        help="continue the prompt as text even where the model was trained on chats")
    parser.add_argument("--system", default=None, help="chat models: a system message before the prompt")
    parser.add_argument(TRUST_FLAG, dest="trust_code", action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must not be negative")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from framework import storage
    from framework.data.chat import RENDERER
    from framework.data.tokenizer import CONFIG_FILE, TokenizerError, chat_config_in
    from framework.errors import installed
    from framework.redact import redacted
    try:
        model, tok = load(args.path, args.trust_code)
        chat = {} if args.raw else chat_config_in(args.path)
        if chat and not installed(RENDERER[0]):
            raise GenerateError(f"{args.path}: its chat template is rendered by {RENDERER[0]}, which is not installed: "
                                f"pip install 'framework[{RENDERER[1]}]' (or --raw: continue the prompt as plain text)")
        if chat:
            print(answer(model, tok, chat, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         args.system, storage.join(args.path, CONFIG_FILE)))
            return 0
    except (GenerateError, TokenizerError) as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        return 2
    text = continuation(model, tok, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
