"""`python -m framework.generate <checkpoint step dir | export dir> --prompt TEXT`: print a continuation.

    python -m framework.generate outputs/run/checkpoints/step_00000200 --prompt "def " --max-new-tokens 100

Reads the weights of any strategy's checkpoint (or an export dir), the tokenizer recorded beside them,
and samples with temperature and top-k from a torch.Generator seeded by --seed: the same seed prints the
same text. --temperature 0 is greedy. Unusable input exits 2 with one `error:` line.

A model trained on chat data (its checkpoint records the chat template) answers: the prompt is a user turn
rendered with that template and the generation prompt, and the printed answer ends at the end of the turn.
--raw continues the prompt as plain text instead.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch


class GenerateError(ValueError):
    """A path that holds no usable model or tokenizer."""


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


def _built(spec, model_cfg):
    model = spec.build(model_cfg)
    model.context_length = spec.context_length(model_cfg)
    return model


@torch.no_grad()
def _from_export(path: str):
    from framework.errors import ConfigError
    from framework.models import hf_files
    from framework.models.spec import spec_for_hf
    hf = hf_files.read_config(path)
    try:
        spec = spec_for_hf(hf)
    except ConfigError as e:
        raise GenerateError(f"{path}: {str(e).partition(': ')[2]}") from None
    model_cfg = spec.model_cfg_from_hf(hf)
    model = _built(spec, model_cfg)
    weights = spec.hf_weights(path, model_cfg)
    for name, param in model.named_parameters():
        param.copy_(weights.full(name))
    from framework.data.tokenizer import TOKENIZER_FILE, load_file
    tok_file = os.path.join(path, TOKENIZER_FILE)
    return model, (load_file(tok_file) if os.path.isfile(tok_file) else None)


def _from_checkpoint(path: str):
    from omegaconf import OmegaConf

    from framework.checkpoint.manager import CONFIG, damage, read_meta
    from framework.data.tokenizer import of_checkpoint
    from framework.export.read import READERS
    from framework.models import lora
    from framework.models.spec import spec_for
    meta = read_meta(path)
    found = damage(path)       # with FRAMEWORK_CHECKPOINT_KEY set, the signature and every file's SHA-256
    if found is not None:
        raise GenerateError(f"refusing {path}: {found}")
    cfg = OmegaConf.load(os.path.join(path, CONFIG))
    _only_a_model_class(cfg.model, os.path.join(path, CONFIG))
    spec = spec_for(cfg.model)
    model = _built(spec, cfg.model)
    c = cfg.get("lora")
    if c is not None and c.enabled:        # the adapters on a float32 base, as the exporter merges them
        names = lora.target_linears(model, spec.block_classes(model), c.targets, spec.lora_skip())
        lora.apply_lora(model, names, c.rank, c.alpha, c.dropout, c.dora)
    model.load_state_dict(READERS[meta["format"]](path))
    return model, of_checkpoint(path, cfg.data)


def _only_a_model_class(model_cfg, where: str) -> None:
    """A checkpoint's model section may name the torch module class to build, and nothing else to call: Hydra
    calls every `_target_` in it with its keys as arguments (subprocess.Popen as well as the model)."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf
    from torch import nn
    model = OmegaConf.to_container(model_cfg, resolve=False)

    def nested(node, at: str):
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in children:
            if key == "_target_" and at:
                return at
            found = nested(value, f"{at}.{key}" if at else str(key))
            if found:
                return found
        return None
    inner = nested({k: v for k, v in model.items() if k != "_target_"}, "")
    if inner:
        raise GenerateError(f"{where}: model.{inner} names a _target_ to call; a checkpoint's model section names "
                            f"one model class")
    try:
        cls = get_class(str(model.get("_target_")))
    except Exception:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise GenerateError(f"{where}: model._target_={model.get('_target_')} is not a torch module class")


def load(path: str):
    """(model in eval mode, tokenizer) from a checkpoint step dir or an export dir."""
    from framework.checkpoint.manager import CheckpointError
    from framework.checkpoint.signing import SigningKeyError
    from framework.checkpoint.unpickle import UnsafeCheckpointError
    from framework.data.tokenizer import TokenizerError
    try:
        if os.path.isfile(os.path.join(path, "meta.json")):
            model, tok = _from_checkpoint(path)
        elif os.path.isfile(os.path.join(path, "config.json")):
            model, tok = _from_export(path)
        else:
            raise GenerateError(f"{path} is neither a checkpoint step dir (meta.json) nor an export dir (config.json)")
    except (CheckpointError, TokenizerError, UnsafeCheckpointError, SigningKeyError) as e:
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
           system: str | None = None) -> str:
    """The assistant's answer to `prompt` as a user turn, in the chat template the model was trained with."""
    from transformers import PreTrainedTokenizerFast

    from framework.data.chat import END_OF_TURN
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat["chat_template"],
                                 **({"bos_token": chat["bos_token"]} if chat.get("bos_token") else {}))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False).ids
    stops = tuple(i for i in (tok.token_to_id(t) for t in END_OF_TURN) if i is not None)
    return tok.decode(sample(model, ids, max_new_tokens, temperature, top_k, seed, _eos_id(tok), stop_ids=stops))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.generate",
                                     description="Continue a prompt with a trained model.")
    parser.add_argument("path", help="a checkpoint step dir or a `python -m framework.export` dir")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=50, help="0 = the whole vocabulary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true",
                        help="continue the prompt as text even where the model was trained on chats")
    parser.add_argument("--system", default=None, help="chat models: a system message before the prompt")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must not be negative")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        model, tok = load(args.path)
    except GenerateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from framework.data.tokenizer import chat_config_in
    chat = {} if args.raw else chat_config_in(args.path)
    if chat:
        print(answer(model, tok, chat, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                     args.system))
        return 0
    text = continuation(model, tok, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
