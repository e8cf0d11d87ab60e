"""Data sources: data.source -> its Source class. Adding a source: one module with its class (see base.py),
one line in SOURCES, one yaml in conf/data. Validation, manifest resolution, tokenizers and the samplers
ask the class, never the source's name."""
from __future__ import annotations

import importlib

from framework.data.sources.base import (TOKEN_DTYPES, DataError, Source, Stream, check_token_range, open_path,
                                         path_kind)
from framework.errors import ConfigError

SOURCES: dict[str, str] = {
    "pydoc": "framework.data.sources.pydoc:Pydoc",
    "text": "framework.data.sources.text:Text",
    "tokens": "framework.data.sources.tokens:Tokens",
    "megatron": "framework.data.sources.megatron:Megatron",
    "mix": "framework.data.sources.mix:Mix",
    "synthetic": "framework.data.sources.synthetic:Synthetic",
    "jsonl": "framework.data.sources.jsonl:Jsonl",
    "parquet": "framework.data.sources.parquet:Parquet",
    "datasets": "framework.data.sources.datasets:Datasets",
    "chat": "framework.data.sources.chat:Chat",
    "preference": "framework.data.sources.preference:Preference",
}


def register(name: str, path: str) -> None:
    """Another source under `name` (a plugin or a test): `path` is "module:class"."""
    SOURCES[name] = path


def source_named(name: str) -> Source:
    if name not in SOURCES:
        raise ConfigError("data.source", f"unknown source {name!r}; use {', '.join(SOURCES)}")
    module, cls = SOURCES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def source_of(data_cfg) -> Source:
    return source_named(data_cfg.source)


def reader_for(path: str, fallback: bool = False) -> Source | None:
    """The source `prepare` reads the input `path` through: the one that reads its kind, else (`fallback`)
    the one that reads any file (text)."""
    readers = [source_named(name) for name in SOURCES]
    for source in readers:
        if not source.fallback_reader and source.reads(path):
            return source
    return next((s for s in readers if s.fallback_reader), None) if fallback else None


def streams(data_cfg) -> list[Stream]:
    """The data's token streams: one for every source but `mix`, which has one per entry."""
    return source_of(data_cfg).streams(data_cfg)


def load_tokens(data_cfg):
    """The single token stream of every source but `mix`."""
    return streams(data_cfg)[0].tokens


def pydoc_corpus_bytes() -> bytes:
    from framework.data.sources.pydoc import pydoc_corpus_bytes as corpus
    return corpus()


__all__ = ["SOURCES", "TOKEN_DTYPES", "DataError", "Source", "Stream", "check_token_range", "load_tokens",
           "open_path", "path_kind", "pydoc_corpus_bytes", "reader_for", "register", "source_named", "source_of",
           "streams"]
