"""Token streams: the embedded corpus, plain text, pre-tokenized token files, synthetic.

Every source returns one flat 1-D integer array; splitting into train/validation and
into sequences happens in batches.py, the same way for all sources.
"""
from __future__ import annotations

import os

import numpy as np

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class DataError(ValueError):
    """A data file that cannot be used; reported as a configuration error."""


def pydoc_corpus_bytes() -> bytes:
    """The English documentation text CPython ships in its standard library (pydoc_data)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def _bytes_to_tokens(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)


def load_tokens(data_cfg) -> np.ndarray:
    source = data_cfg.source
    if source == "pydoc":
        return _bytes_to_tokens(pydoc_corpus_bytes())
    if source == "text":
        with open(data_cfg.path, "rb") as f:
            return _bytes_to_tokens(f.read())
    if source == "tokens":
        dtype = TOKEN_DTYPES[data_cfg.dtype]
        size = os.path.getsize(data_cfg.path)
        if size == 0:
            raise DataError(f"data.path: {data_cfg.path} is empty")
        if size % np.dtype(dtype).itemsize:
            raise DataError(f"data.path: {data_cfg.path} holds {size} bytes, not a whole number of "
                            f"{data_cfg.dtype} tokens; check data.dtype")
        tokens = np.memmap(data_cfg.path, dtype=dtype, mode="r")
        return tokens
    if source == "synthetic":
        rng = np.random.default_rng(12345)
        return rng.integers(0, data_cfg.vocab_size, size=data_cfg.num_tokens, dtype=np.int64)
    raise DataError(f"data.source: unknown source {source!r}; use pydoc, text, tokens or synthetic")


def check_token_range(tokens: np.ndarray, vocab_size: int, path: str | None) -> None:
    """A token id >= vocab_size would index past the embedding; say so before training."""
    probe = tokens if len(tokens) <= 50_000_000 else tokens[:50_000_000]
    top = int(probe.max()) if len(probe) else 0
    if top >= vocab_size:
        raise DataError(f"data.vocab_size: {path or 'data'} holds token id {top}, "
                        f"but data.vocab_size is {vocab_size}")
