"""Tokenizers for `prepare` and `generate`, all Hugging Face `tokenizers` objects.

Three kinds: a user's tokenizer.json, a byte-level BPE trained on the corpus being prepared, and
plain bytes (id = byte value, as the pydoc and text sources read them) with an end-of-text token
after the 256 bytes. Every kind is saved as a tokenizer.json, so `transformers.AutoTokenizer` loads
what training used.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from framework import storage

EOS_TOKEN = "<|endoftext|>"
# End-of-text spellings of common tokenizers, tried in order when a tokenizer.json is given.
EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
TOKENIZER_FILE = "tokenizer.json"
BYTES = "bytes"


class TokenizerError(ValueError):
    """A tokenizer spec or file that cannot be used."""


def _byte_chars() -> dict[int, str]:
    """The printable stand-in character of each byte that byte-level BPE (GPT-2's) works on."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(256, 512))
    return {b: chr(b if b in printable else next(extra)) for b in range(256)}


def byte_tokenizer() -> Tokenizer:
    """Token id = byte value (0-255), then EOS as 256: what byte-level models read, as a tokenizer.json."""
    chars = _byte_chars()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS_TOKEN])
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` entries (EOS included) learnt from `texts`."""
    if vocab_size < 257:
        raise TokenizerError(f"bpe:{vocab_size}: a byte-level BPE needs at least 257 entries (256 bytes + EOS)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def parse_spec(spec: str) -> tuple[str, int | str | None]:
    """`bytes`, `bpe:VOCAB` or a path -> (kind, argument)."""
    if spec == BYTES:
        return BYTES, None
    if spec.startswith("bpe:"):
        try:
            return "bpe", int(spec[4:])
        except ValueError:
            raise TokenizerError(f"{spec}: write bpe:VOCAB with an integer vocabulary size, e.g. bpe:8192") from None
    return "file", spec


def load_file(path: str) -> Tokenizer:
    """A tokenizer.json, or the one in a Hugging Face tokenizer dir, at a path or a URL (a checkpoint on
    object storage)."""
    if storage.isdir(path):
        path = storage.join(path, TOKENIZER_FILE)
    if not storage.isfile(path):
        raise TokenizerError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_str(storage.read_text(path))
    except Exception as e:
        raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0][:120]})") from None


def build(spec: str, training_texts: Iterator[str] | None = None) -> Tokenizer:
    kind, arg = parse_spec(spec)
    if kind == BYTES:
        return byte_tokenizer()
    if kind == "bpe":
        return train_bpe(training_texts or iter(()), arg)
    return load_file(arg)


def eos_token(tok: Tokenizer) -> tuple[str, int]:
    for token in EOS_CANDIDATES:
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token, token_id
    raise TokenizerError(f"the tokenizer has none of the end-of-text tokens {', '.join(EOS_CANDIDATES)}")


def _template_processors(post: dict | None) -> Iterator[dict]:
    if not post:
        return
    if post.get("type") == "Sequence":
        for inner in post.get("processors", []):
            yield from _template_processors(inner)
    else:
        yield post


def bos_ids(tok: Tokenizer) -> list[int]:
    """The ids the tokenizer's own post-processor puts before a single text (a Llama tokenizer's
    <|begin_of_text|> or <s>; BERT-style [CLS]); [] where it adds none (GPT-2, bytes)."""
    post = json.loads(tok.to_str()).get("post_processor")
    for proc in _template_processors(post):
        if proc.get("type") in ("RobertaProcessing", "BertProcessing"):
            return [proc["cls"][1]]
        if proc.get("type") == "TemplateProcessing":
            ids = []
            for piece in proc.get("single", []):
                if "Sequence" in piece:
                    return ids
                ids += proc["special_tokens"][piece["SpecialToken"]["id"]]["ids"]
    return []


def special_tokens(tok: Tokenizer) -> dict[str, str]:
    """bos/eos/unk tokens as this tokenizer defines them (a kind it lacks is left out)."""
    out = {"eos_token": eos_token(tok)[0]}
    bos = bos_ids(tok)
    if bos:
        out["bos_token"] = tok.id_to_token(bos[0])
    unk = getattr(tok.model, "unk_token", None)
    if unk and tok.token_to_id(unk) is not None:
        out["unk_token"] = unk
    return out


def vocab_size(tok: Tokenizer) -> int:
    return tok.get_vocab_size(with_added_tokens=True)


CONFIG_FILE = "tokenizer_config.json"


def record_in(data_cfg, out_dir: str) -> None:
    """Copy the data's tokenizer.json into a checkpoint dir, so the weights never lose their vocabulary; chat
    data's tokenizer_config.json (its chat template) goes beside it."""
    spec = data_cfg.get("tokenizer")
    if spec and spec != BYTES and os.path.isfile(spec):
        with open(spec, "rb") as f:
            storage.write_bytes(storage.join(out_dir, TOKENIZER_FILE), f.read())
        config = os.path.join(os.path.dirname(os.path.abspath(spec)), CONFIG_FILE)
        if os.path.isfile(config):
            with open(config, "rb") as f:
                storage.write_bytes(storage.join(out_dir, CONFIG_FILE), f.read())


def chat_config_in(folder: str) -> dict:
    """The chat template recorded in a checkpoint or export dir (its tokenizer_config.json, read as data: the
    template is rendered in Jinja's sandbox) and the BOS token it writes, as write_hf_files takes them; {} if
    none. TokenizerError for a file that is not JSON."""
    config = storage.join(folder, CONFIG_FILE)
    if not storage.isfile(config):
        return {}
    try:
        found = json.loads(storage.read_text(config))
    except ValueError as e:
        raise TokenizerError(f"{config}: not JSON ({str(e).splitlines()[0][:120]})") from None
    template = found.get("chat_template") if isinstance(found, dict) else None
    if not isinstance(template, str) or not template:
        return {}
    bos = found.get("bos_token")
    if bos is not None and not isinstance(bos, str):
        raise TokenizerError(f"{config}: bos_token: {type(bos).__name__}, not the token's text")
    return {"chat_template": template, **({"bos_token": bos} if bos else {})}


def chat_config_of_data(data_cfg) -> dict:
    """The chat template the job trains with, as chat_config_in reads it from beside data.tokenizer (a prepared
    chat dataset's: admission points data.tokenizer there), which record_in copies into each checkpoint; {} if
    none."""
    spec = data_cfg.get("tokenizer")
    if not spec or not os.path.isfile(spec):
        return {}
    return chat_config_in(os.path.dirname(os.path.abspath(spec)))


def of_checkpoint(step_dir: str, data_cfg) -> Tokenizer | None:
    """The tokenizer a checkpoint's weights were trained with: its copied tokenizer.json, else bytes for the
    byte-level sources; None when the run never named one (a flat token file without data.tokenizer).
    `data_cfg`: the data section of the checkpoint's config as framework/config/saved.py reads it (checked)."""
    copied = storage.join(step_dir, TOKENIZER_FILE)
    if storage.isfile(copied):
        return load_file(copied)
    return of_data(data_cfg)


def of_data(data_cfg) -> Tokenizer | None:
    """The data's tokenizer: data.tokenizer, else bytes for the byte-level sources, else None."""
    from framework.data.sources import source_named   # the sources' modules import this one
    spec = data_cfg.get("tokenizer")
    if spec == BYTES or (spec is None and source_named(data_cfg.get("source")).byte_level):
        return byte_tokenizer()
    if spec and os.path.isfile(spec):
        return load_file(spec)
    return None


def write_hf_files(tok: Tokenizer, out_dir: str, chat_template: str | None = None,
                   bos_token: str | None = None) -> list[str]:
    """tokenizer.json plus the tokenizer_config.json that lets AutoTokenizer load it as a fast tokenizer, with
    the tokenizer's own special tokens (and its chat template, where it has one, with the BOS it writes)."""
    tok.save(os.path.join(out_dir, TOKENIZER_FILE))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special_tokens(tok), "model_max_length": 1_000_000,
              "clean_up_tokenization_spaces": False, **({"chat_template": chat_template} if chat_template else {}),
              **({"bos_token": bos_token} if bos_token else {})}
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2)
    return [TOKENIZER_FILE, CONFIG_FILE]
