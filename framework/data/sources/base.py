"""What every data source is: a class whose instance answers, for its part of the data section, what
validation, manifest resolution, tokenizers and the samplers ask.

Every source yields token streams: flat 1-D token arrays (a numpy array, a memmap, or a ShardedTokens
view over a prepared dataset's shards: anything with len(), contiguous slicing and np.asarray), with the
document starts and loss mask where the data has them. Splitting into train / validation and into
sequences happens in batches.py, the same way for all of them. A mixture is a list of such streams with
weights.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from framework import storage
from framework.data import megatron, token_dataset
from framework.errors import ConfigError, MissingExtra, installed

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
#: data.* keys read through the operating system's own calls (the data is opened, memory-mapped, prepared there)
LOCAL_PATH_KEYS = ("path", "tokenizer", "cache_dir")


class DataError(ValueError):
    """A data file that cannot be used; reported as a configuration error (`key: message`)."""


@dataclass
class Stream:
    name: str
    tokens: object
    weight: float = 1.0
    manifest: dict | None = None    # prepared datasets: vocabulary and range are known without scanning
    starts: Optional[np.ndarray] = None   # each document's start offset, then the end (prepared datasets)
    mask: object = None             # instruction data: per token, 1 where it is trained as a target


class Source:
    """A kind of data (`data.source`). The defaults are those of a source that needs nothing from the user."""
    name = "base"
    #: what data.path names for this source ("file", "prefix", ...); None: the source takes no path
    path_names: Optional[str] = None
    #: its token ids are bytes: with no data.tokenizer its tokenizer is the byte-level one
    byte_level = False
    #: model.vocab_size follows data.vocab_size unless given on the command line (token sources)
    vocab_from_data = False
    #: several weighted streams, dealt out by framework/data/mixture.py
    mixture = False
    #: `prepare` reads an input through this source when no other source reads it (text)
    fallback_reader = False
    #: (what it reads "are read by", the optional package that reads it, the extra that installs it); None: it
    #: reads with the base install
    reads_with: Optional[tuple[str, str, str]] = None

    def reads(self, path: str) -> bool:
        """Whether `prepare` reads the input `path` (a file, or a directory read as a whole) as records of
        this source's kind."""
        return False

    def records(self, path: str, columns: list[str] | None = None,
                split: str = "train") -> Iterator[tuple[str, object]]:
        """(where, record) of one input: `where` names the file and line or row for errors; a record is a dict
        (only `columns`, where given and the format can read columns alone) or a whole text; `split`: which
        split of a dataset that has several."""
        raise NotImplementedError(f"data.source={self.name} reads no documents")

    def check(self, data_cfg) -> None:
        """Cheap checks of the files the data names, before anything is opened; raise ConfigError."""
        self.check_installed("data.source")
        for key in LOCAL_PATH_KEYS:
            value = data_cfg.get(key)
            if value and (storage.is_url(value) or storage.url_problem(value)):
                raise ConfigError(f"data.{key}", f"{value}: takes a local path, not a URL; copy the files down first")
        if self.path_names and not data_cfg.path:
            raise ConfigError("data.path", f"is required for data.source={self.name}; set data.path=/path/to/"
                                           f"{self.path_names}")

    def check_installed(self, key: str, where: str = "") -> None:
        """The package it reads with is installed, or MissingExtra naming `key` (and `where`: the input)."""
        if self.reads_with is not None and not installed(self.reads_with[1]):
            what, package, extra = self.reads_with
            raise MissingExtra(key, f"{where}: {what}" if where else what, package, extra)

    def resolve(self, data_cfg) -> None:
        """In the launching process, before validation: fill what the data says of itself into data.*
        (prepared sources tokenize their inputs here)."""

    def dataset_dirs(self, data_cfg) -> list[tuple[str, str]]:
        """(config key, path) of every prepared dataset dir the data names: their manifests fill data.*."""
        return []

    def streams(self, data_cfg) -> list[Stream]:
        """The data's token streams (one, for every source but a mixture)."""
        raise NotImplementedError


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


def open_dataset(path: str) -> Stream:
    """A prepared dataset dir as a Stream: tokens, document starts (None where documents.npy is missing or
    does not match: only document masks and instruction data need them) and, where it has one, its loss mask."""
    manifest = token_dataset.read_manifest(path)
    tokens = token_dataset.open_tokens(path)
    if manifest.get("loss_mask"):
        return Stream(path, tokens, manifest=manifest, starts=token_dataset.open_starts(path),
                      mask=token_dataset.open_mask(path))
    try:
        starts = token_dataset.open_starts(path)
    except token_dataset.DatasetError:
        starts = None
    return Stream(path, tokens, manifest=manifest, starts=starts)


def open_path(path: str, data_cfg, key: str = "data.path") -> Stream:
    """A token file, dataset dir or Megatron prefix as a Stream, read lazily."""
    kind = path_kind(path)
    try:
        if kind == "dataset":
            return open_dataset(path)
        if kind == "megatron":
            return Stream(path, megatron.open_tokens(path))
    except (token_dataset.DatasetError, megatron.MegatronError) as e:
        raise DataError(f"{key}: {e}") from None
    if kind == "file":
        return Stream(path, _flat_token_file(path, data_cfg.dtype, key))
    raise DataError(f"{key}: no such file, dataset dir or Megatron prefix: {path}")


def check_token_range(tokens, vocab_size: int, path: str | None) -> None:
    """A token id >= vocab_size would index past the embedding; say so before training."""
    probe = tokens if len(tokens) <= 50_000_000 else tokens[:50_000_000]
    top = int(np.asarray(probe).max()) if len(probe) else 0
    if top >= vocab_size:
        raise DataError(f"data.vocab_size: {path or 'data'} holds token id {top}, "
                        f"but data.vocab_size is {vocab_size}")
