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

from framework.models.sampling import next_token


class GenerateError(ValueError):
    """A path that holds no usable model or tokenizer."""


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


def _built(spec, model_cfg, where: str):
    try:
        model = spec.build(model_cfg)
    except (OSError, ValueError) as e:     # a model=hf dir that is gone, or that holds code of its own
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GenerateError(f"{where}: model: cannot be built ({type(e).__name__}: {first[:300]})") from None
    model.context_length = spec.context_length(model_cfg)
    return model


@torch.no_grad()
def _from_export(path: str, trust_code: bool):
    """The export's model (its family from config.json's model_type), with its LoRA adapter/ if it has one."""
    import json

    from framework.config.saved import checked_model
    from framework.errors import ConfigError
    from framework.export.adapter import ADAPTER_DIR, load_adapter
    from framework.models import hf_files
    from framework.models.spec import spec_for_hf
    where = os.path.join(path, hf_files.CONFIG)
    try:
        hf = hf_files.read_config(path)
        spec = spec_for_hf(hf)
        model_cfg = spec.model_cfg_from_hf(hf)
    except json.JSONDecodeError as e:
        raise GenerateError(f"{where}: not JSON (line {e.lineno})") from None
    except ConfigError as e:
        raise GenerateError(f"{path}: {str(e).partition(': ')[2]}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise GenerateError(f"{where}: not a model config this framework reads ({type(e).__name__}: {e})") from None
    spec, model_cfg = checked_model(model_cfg, where, trust_code)
    model = _built(spec, model_cfg, where)
    weights = spec.hf_weights(path, model_cfg)
    for name, param in model.named_parameters():
        param.copy_(weights.full(name))
    if os.path.isdir(os.path.join(path, ADAPTER_DIR)):
        load_adapter(path, spec, model_cfg, model)
    from framework.data.tokenizer import TOKENIZER_FILE, load_file
    tok_file = os.path.join(path, TOKENIZER_FILE)
    return model, (load_file(tok_file) if os.path.isfile(tok_file) else None)


def _from_checkpoint(path: str, trust_code: bool):
    """The checkpoint's model, from its config read as data (framework/config/saved.py); a LoRA run's adapters on
    a float32 base, as the exporter merges them."""
    from framework.checkpoint.names import CONFIG, read_meta
    from framework.checkpoint.resume import damage
    from framework.config.saved import read_saved_config
    from framework.data.tokenizer import of_checkpoint
    from framework.export.read import READERS
    from framework.models import lora
    meta = read_meta(path)
    found = damage(path)       # with FRAMEWORK_CHECKPOINT_KEY set, the signature and every file's SHA-256
    if found is not None:
        raise GenerateError(f"refusing {path}: {found}")
    saved = read_saved_config(path, trust_code)
    if meta.get("format") not in READERS:
        raise GenerateError(f"{path} has state format {meta.get('format')!r}; generate reads {' and '.join(READERS)}")
    spec, c = saved.spec, saved.lora
    model = _built(spec, saved.model, os.path.join(path, CONFIG))
    if c.enabled:
        names = lora.target_linears(model, spec.block_classes(model), c.targets, spec.lora_skip())
        lora.apply_lora(model, names, c.rank, c.alpha, c.dropout, c.dora)
    model.load_state_dict(READERS[meta["format"]](path))
    return model, of_checkpoint(path, saved.data)


def load(path: str, trust_code: bool = False):
    """(model in eval mode, tokenizer) from a checkpoint step dir or an export dir. `trust_code`: a class the
    checkpoint's config names may be imported (TRUST_FLAG)."""
    from framework.checkpoint.names import CheckpointError
    from framework.checkpoint.signing import SigningKeyError
    from framework.checkpoint.unpickle import UnsafeCheckpointError
    from framework.config.saved import SavedConfigError
    from framework.data.tokenizer import TokenizerError
    from framework.models.hf_files import LayoutError
    try:
        if os.path.isfile(os.path.join(path, "meta.json")):
            model, tok = _from_checkpoint(path, trust_code)
        elif os.path.isfile(os.path.join(path, "config.json")):
            model, tok = _from_export(path, trust_code)
        else:
            raise GenerateError(f"{path} is neither a checkpoint step dir (meta.json) nor an export dir (config.json)")
    except (CheckpointError, TokenizerError, SavedConfigError, UnsafeCheckpointError, SigningKeyError,
            LayoutError) as e:
        raise GenerateError(str(e)) from None
    if tok is None:
        raise GenerateError(f"{path} records no tokenizer; train with data.tokenizer=/path/to/tokenizer.json")
    return model.eval(), tok


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
