"""`python -m framework.generate <checkpoint step dir | export dir> --prompt TEXT`: print a continuation.

    python -m framework.generate outputs/run/checkpoints/step_00000200 --prompt "def " --max-new-tokens 100

Reads the weights of any strategy's checkpoint (or an export dir), the tokenizer recorded beside them,
and samples with temperature and top-k from a torch.Generator seeded by --seed: the same seed prints the
same text. --temperature 0 is greedy. Unusable input exits 2 with one `error:` line.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

LLAMA_TARGET = "framework.models.llama.Llama"


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
           seed: int = 0, eos_id: int | None = None) -> list[int]:
    """Continue `ids` token by token (the whole window each time: these models are small)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = list(ids)
    window = model.args.max_seq_len
    for _ in range(max_new_tokens):
        next_id = next_token(model(torch.tensor([tokens[-window:]]))[0, -1], temperature, top_k, generator)
        if next_id == eos_id:
            break
        tokens.append(next_id)
    return tokens[len(ids):]


def _from_export(path: str):
    from framework.models.llama import hf_adapter as hf_layout
    from framework.models.llama import Llama
    hf = hf_layout.read_hf_config(path)
    model = Llama(dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
                  n_kv_heads=hf.get("num_key_value_heads"), vocab_size=hf["vocab_size"],
                  ffn_dim=hf["intermediate_size"], norm_eps=hf.get("rms_norm_eps", 1e-5),
                  rope_theta=hf.get("rope_theta", 10000.0), max_seq_len=hf["max_position_embeddings"],
                  tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    hf_layout.load_into(model, path)
    from framework.data.tokenizer import TOKENIZER_FILE, load_file
    tok_file = os.path.join(path, TOKENIZER_FILE)
    return model, (load_file(tok_file) if os.path.isfile(tok_file) else None)


def _from_checkpoint(path: str):
    from omegaconf import OmegaConf

    from framework.checkpoint.manager import CONFIG, read_meta
    from framework.data.tokenizer import of_checkpoint
    from framework.export.read import READERS
    from framework.models.llama import Llama
    meta = read_meta(path)
    cfg = OmegaConf.load(os.path.join(path, CONFIG))
    if cfg.model.get("_target_") != LLAMA_TARGET:
        raise GenerateError(f"{path} holds model._target_={cfg.model.get('_target_')}; generation reads "
                            f"{LLAMA_TARGET} checkpoints")
    model = Llama(**{k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"})
    model.load_state_dict(READERS[meta["format"]](path))
    return model, of_checkpoint(path, cfg.data)


def load(path: str):
    """(model in eval mode, tokenizer) from a checkpoint step dir or an export dir."""
    from framework.checkpoint.manager import CheckpointError
    from framework.data.tokenizer import TokenizerError
    try:
        if os.path.isfile(os.path.join(path, "meta.json")):
            model, tok = _from_checkpoint(path)
        elif os.path.isfile(os.path.join(path, "config.json")):
            model, tok = _from_export(path)
        else:
            raise GenerateError(f"{path} is neither a checkpoint step dir (meta.json) nor an export dir (config.json)")
    except (CheckpointError, TokenizerError) as e:
        raise GenerateError(str(e)) from None
    if tok is None:
        raise GenerateError(f"{path} records no tokenizer; train with data.tokenizer=/path/to/tokenizer.json")
    return model.eval(), tok


def continuation(model, tok, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
    from framework.data.tokenizer import TokenizerError, eos_token
    try:
        eos_id = eos_token(tok)[1]
    except TokenizerError:
        eos_id = None
    ids = tok.encode(prompt, add_special_tokens=False).ids or ([eos_id] if eos_id is not None else [0])
    return tok.decode(sample(model, ids, max_new_tokens, temperature, top_k, seed, eos_id))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.generate",
                                     description="Continue a prompt with a trained model.")
    parser.add_argument("path", help="a checkpoint step dir or a `python -m framework.export` dir")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=50, help="0 = the whole vocabulary")
    parser.add_argument("--seed", type=int, default=0)
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
    text = continuation(model, tok, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
