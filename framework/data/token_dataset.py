"""The prepared dataset directory: its layout, its writer and its memory-mapped reader.

    <dir>/manifest.json       written last: tokens, documents, dtype, vocab size, EOS id, shards
    <dir>/shard_00000.bin     flat token ids (uint16 or uint32), documents back to back, EOS after each
    <dir>/mask_00000.bin      instruction data only (manifest "loss_mask": true): one uint8 per token of the
                              shard of the same number, 1 where the token is trained as a target
    <dir>/documents.npy       int64 start offset of every document in the concatenated stream, then the end
    <dir>/tokenizer.json      the tokenizer that produced the ids (tokenizer_config.json beside it: its chat
                              template, for chat data)

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


def mask_name(index: int) -> str:
    return f"mask_{index:05d}.bin"


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
    return _open_shards(path, manifest, np.dtype(manifest["dtype"]), [s["file"] for s in manifest["shards"]])


def open_mask(path: str) -> ShardedTokens:
    """The loss mask of instruction data, one uint8 per token, memory-mapped like the tokens."""
    manifest = read_manifest(path)
    return _open_shards(path, manifest, np.dtype(np.uint8), [mask_name(i) for i in range(len(manifest["shards"]))])


def open_starts(path: str) -> np.ndarray:
    """documents.npy: each document's start offset, then the end of the last, checked against the manifest."""
    manifest = read_manifest(path)
    file = os.path.join(path, DOCUMENTS)
    try:
        starts = np.load(file, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DatasetError(f"{file} is missing or corrupt ({type(e).__name__})") from None
    if starts.ndim != 1 or len(starts) != manifest["documents"] + 1 or (len(starts) and starts[-1] != manifest["tokens"]):
        raise DatasetError(f"{file} does not match the manifest's {manifest['documents']} documents of "
                           f"{manifest['tokens']} tokens")
    return starts


def _open_shards(path: str, manifest: dict, dtype: np.dtype, files: list[str]) -> ShardedTokens:
    shards = []
    for shard, name in zip(manifest["shards"], files):
        file = os.path.join(path, name)
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
    """Appends token arrays into shards of at most `shard_tokens` ids; a document may span two shards. With
    `loss_mask`, every write brings a mask of the same length, stored in shards of the same sizes."""

    def __init__(self, out_dir: str, dtype: str, shard_tokens: int, loss_mask: bool = False):
        self.out_dir, self.dtype, self.shard_tokens = out_dir, np.dtype(dtype), shard_tokens
        self.loss_mask = loss_mask
        self.shards: list[dict] = []
        self.doc_starts: list[np.ndarray] = [np.zeros(1, np.int64)]
        self.tokens = 0
        self._files = None
        self._in_shard = 0

    def write_documents(self, tokens: np.ndarray, doc_lengths: np.ndarray, mask: np.ndarray | None = None) -> None:
        if (mask is not None) != self.loss_mask:
            raise ValueError("a loss-mask dataset takes a mask with every write, any other none")
        self.doc_starts.append(self.tokens + np.cumsum(doc_lengths, dtype=np.int64))
        parts = [tokens.astype(self.dtype, copy=False)] + ([mask.astype(np.uint8, copy=False)] if self.loss_mask else [])
        while len(parts[0]):
            if self._files is None or self._in_shard == self.shard_tokens:
                self._next_shard()
            take = min(len(parts[0]), self.shard_tokens - self._in_shard)
            for f, part in zip(self._files, parts):
                f.write(part[:take].tobytes())
            self._in_shard += take
            self.tokens += take
            parts = [part[take:] for part in parts]

    def _names(self, index: int) -> list[str]:
        return [shard_name(index)] + ([mask_name(index)] if self.loss_mask else [])

    def _next_shard(self) -> None:
        self._close_shard()
        self._files = [open(os.path.join(self.out_dir, name), "wb") for name in self._names(len(self.shards))]
        self._in_shard = 0

    def _close_shard(self) -> None:
        if self._files is not None:
            for f in self._files:
                f.close()
            name = shard_name(len(self.shards))
            self.shards.append({"file": name, "tokens": self._in_shard,
                                "sha256": file_sha256(os.path.join(self.out_dir, name))})
            self._files = None

    def finish(self, **manifest_fields) -> dict:
        """Close the last shard, write documents.npy and then manifest.json; return the manifest."""
        self._close_shard()
        starts = np.concatenate(self.doc_starts)
        np.save(os.path.join(self.out_dir, DOCUMENTS), starts)
        manifest = {"format": FORMAT, "version": VERSION, "tokens": self.tokens, "documents": len(starts) - 1,
                    "dtype": self.dtype.name, **({"loss_mask": True} if self.loss_mask else {}),
                    **manifest_fields, "shards": self.shards}
        with open(os.path.join(self.out_dir, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        return manifest
