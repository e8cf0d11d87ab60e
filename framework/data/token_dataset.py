"""The prepared dataset directory: its layout, its writer and its memory-mapped reader.

    <dir>/manifest.json       written last: tokens, documents, dtype, vocab size, EOS id, shards
    <dir>/shard_00000.bin     flat token ids (uint16 or uint32), documents back to back, EOS after each
    <dir>/documents.npy       int64 start offset of every document in the concatenated stream, then the end
    <dir>/tokenizer.json      the tokenizer that produced the ids

Opening one reads the manifest and stats the shards; token ids are read only when a sequence is asked for,
so a 100 GB dataset opens as fast as a 1 MB one.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

MANIFEST, DOCUMENTS, FORMAT, VERSION = "manifest.json", "documents.npy", "framework-tokens", 1


class DatasetError(ValueError):
    """A dataset directory that cannot be used."""


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.bin"


class ShardedTokens:
    """Several memory-mapped shards seen as one 1-D token array. Slicing gives another lazy view;
    np.asarray(view) reads just that window, crossing shard boundaries as needed."""

    def __init__(self, shards: list[np.ndarray], start: int = 0, stop: int | None = None):
        self._shards = shards
        self._ends = np.cumsum([len(s) for s in shards])
        self._start = start
        self._stop = int(self._ends[-1]) if stop is None else stop
        self.dtype = shards[0].dtype

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardedTokens supports contiguous slices only")
        start, stop, _ = key.indices(len(self))
        return ShardedTokens(self._shards, self._start + start, self._start + max(start, stop))

    def __array__(self, dtype=None, copy=None):
        parts, pos = [], self._start
        while pos < self._stop:
            i = int(np.searchsorted(self._ends, pos, side="right"))
            shard_start = int(self._ends[i - 1]) if i else 0
            take = min(self._stop, int(self._ends[i])) - pos
            parts.append(self._shards[i][pos - shard_start: pos - shard_start + take])
            pos += take
        out = np.concatenate(parts) if parts else np.empty(0, self.dtype)
        return out.astype(dtype, copy=False) if dtype is not None else out


def read_manifest(path: str) -> dict:
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DatasetError(f"{path} has no {MANIFEST}; make one with `python -m framework.data.prepare`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}/{MANIFEST} is corrupt ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DatasetError(f"{path}/{MANIFEST} is not a {FORMAT} v{VERSION} manifest")
    return manifest


def open_tokens(path: str) -> ShardedTokens:
    """Memory-map every shard after checking each one's size against the manifest (no reading)."""
    manifest = read_manifest(path)
    dtype = np.dtype(manifest["dtype"])
    shards = []
    for shard in manifest["shards"]:
        file = os.path.join(path, shard["file"])
        expected = shard["tokens"] * dtype.itemsize
        size = os.path.getsize(file) if os.path.isfile(file) else None
        if size != expected:
            raise DatasetError(f"{file} is {'missing' if size is None else f'{size} bytes'}; "
                               f"the manifest says {expected} bytes")
        shards.append(np.memmap(file, dtype=dtype, mode="r"))
    if not shards:
        raise DatasetError(f"{path} holds no tokens")
    return ShardedTokens(shards)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class ShardWriter:
    """Appends token arrays into shards of at most `shard_tokens` ids; a document may span two shards."""

    def __init__(self, out_dir: str, dtype: str, shard_tokens: int):
        self.out_dir, self.dtype, self.shard_tokens = out_dir, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []
        self.doc_starts: list[np.ndarray] = [np.zeros(1, np.int64)]
        self.tokens = 0
        self._file = None
        self._in_shard = 0

    def write_documents(self, tokens: np.ndarray, doc_lengths: np.ndarray) -> None:
        self.doc_starts.append(self.tokens + np.cumsum(doc_lengths, dtype=np.int64))
        tokens = tokens.astype(self.dtype, copy=False)
        while len(tokens):
            if self._file is None or self._in_shard == self.shard_tokens:
                self._next_shard()
            take = min(len(tokens), self.shard_tokens - self._in_shard)
            self._file.write(tokens[:take].tobytes())
            self._in_shard += take
            self.tokens += take
            tokens = tokens[take:]

    def _next_shard(self) -> None:
        self._close_shard()
        self._file = open(os.path.join(self.out_dir, shard_name(len(self.shards))), "wb")
        self._in_shard = 0

    def _close_shard(self) -> None:
        if self._file is not None:
            self._file.close()
            name = shard_name(len(self.shards))
            self.shards.append({"file": name, "tokens": self._in_shard,
                                "sha256": file_sha256(os.path.join(self.out_dir, name))})
            self._file = None

    def finish(self, **manifest_fields) -> dict:
        """Close the last shard, write documents.npy and then manifest.json; return the manifest."""
        self._close_shard()
        starts = np.concatenate(self.doc_starts)
        np.save(os.path.join(self.out_dir, DOCUMENTS), starts)
        manifest = {"format": FORMAT, "version": VERSION, "tokens": self.tokens, "documents": len(starts) - 1,
                    "dtype": self.dtype.name, **manifest_fields, "shards": self.shards}
        with open(os.path.join(self.out_dir, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        return manifest
