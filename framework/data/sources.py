"""Token streams: the embedded corpus, plain text, token files, prepared dataset dirs, Megatron
datasets, synthetic.

Every source is one flat 1-D token array: a numpy array, a memmap, or a ShardedTokens view over a
dataset's shards (anything with len(), contiguous slicing and np.asarray). Splitting into train /
validation and into sequences happens in batches.py, the same way for all of them. A mixture is a
list of such streams with weights (`streams`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from framework.data import megatron, token_dataset

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SOURCES = ("pydoc", "text", "tokens", "megatron", "mix", "synthetic")


class DataError(ValueError):
    """A data file that cannot be used; reported as a configuration error (`key: message`)."""


@dataclass
class Stream:
    name: str
    tokens: object
    weight: float = 1.0
    manifest: dict | None = None    # prepared datasets: vocabulary and range are known without scanning


def pydoc_corpus_bytes() -> bytes:
    """The English documentation text CPython ships in its standard library (pydoc_data)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def _bytes_to_tokens(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)


def path_kind(path: str) -> str | None:
    """dataset (a prepared dir), megatron (a .bin/.idx prefix), file (flat tokens), or None."""
    if os.path.isdir(path):
        return "dataset"
    if os.path.isfile(path + ".idx"):
        return "megatron"
    if os.path.isfile(path):
        return "file"
    return None


def _flat_token_file(path: str, dtype_name: str, key: str) -> np.ndarray:
    dtype = TOKEN_DTYPES[dtype_name]
    size = os.path.getsize(path)
    if size == 0 or size % np.dtype(dtype).itemsize:
        raise DataError(f"{key}: {path} holds {size} bytes, not a whole number of "
                        f"{dtype_name} tokens; check data.dtype")
    return np.memmap(path, dtype=dtype, mode="r")


def open_path(path: str, data_cfg, key: str = "data.path") -> Stream:
    """A token file, dataset dir or Megatron prefix as a Stream, read lazily."""
    kind = path_kind(path)
    try:
        if kind == "dataset":
            return Stream(path, token_dataset.open_tokens(path), manifest=token_dataset.read_manifest(path))
        if kind == "megatron":
            return Stream(path, megatron.open_tokens(path))
    except (token_dataset.DatasetError, megatron.MegatronError) as e:
        raise DataError(f"{key}: {e}") from None
    if kind == "file":
        return Stream(path, _flat_token_file(path, data_cfg.dtype, key))
    raise DataError(f"{key}: no such file, dataset dir or Megatron prefix: {path}")


def source_name(source_cfg) -> str:
    return source_cfg.name or os.path.basename(os.path.normpath(source_cfg.path))


def streams(data_cfg) -> list[Stream]:
    """The data's token streams: one for every source but `mix`, which has one per entry."""
    if data_cfg.source == "mix":
        out = []
        for i, source in enumerate(data_cfg.sources):
            stream = open_path(source.path, data_cfg, f"data.sources[{i}].path")
            stream.name, stream.weight = source_name(source), source.weight
            out.append(stream)
        return out
    if data_cfg.source == "megatron":
        try:
            return [Stream(data_cfg.path, megatron.open_tokens(data_cfg.path))]
        except megatron.MegatronError as e:
            raise DataError(f"data.path: {e}") from None
    if data_cfg.source == "tokens":
        return [open_path(data_cfg.path, data_cfg)]
    return [Stream(data_cfg.source, load_tokens(data_cfg))]


def load_tokens(data_cfg):
    """The single token stream of every source but `mix`."""
    source = data_cfg.source
    if source == "pydoc":
        return _bytes_to_tokens(pydoc_corpus_bytes())
    if source == "text":
        with open(data_cfg.path, "rb") as f:
            return _bytes_to_tokens(f.read())
    if source in ("tokens", "megatron"):
        return streams(data_cfg)[0].tokens
    if source == "synthetic":
        rng = np.random.default_rng(12345)
        return rng.integers(0, data_cfg.vocab_size, size=data_cfg.num_tokens, dtype=np.int64)
    raise DataError(f"data.source: unknown source {source!r}; use {', '.join(SOURCES)}")


def check_token_range(tokens, vocab_size: int, path: str | None) -> None:
    """A token id >= vocab_size would index past the embedding; say so before training."""
    probe = tokens if len(tokens) <= 50_000_000 else tokens[:50_000_000]
    top = int(np.asarray(probe).max()) if len(probe) else 0
    if top >= vocab_size:
        raise DataError(f"data.vocab_size: {path or 'data'} holds token id {top}, "
                        f"but data.vocab_size is {vocab_size}")
