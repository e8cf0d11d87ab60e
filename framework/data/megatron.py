"""Megatron-LM indexed datasets (<prefix>.bin + <prefix>.idx) as one flat token stream.

We read the format ourselves instead of importing megatron-core's IndexedDataset: importing
megatron.core pulls in its optimizer and transformer packages (seconds of start-up and warnings about
Transformer Engine on every rank), and all training needs is the .bin memory-mapped with the dtype the
.idx names. The .idx layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter): the magic
b"MMIDIDX\\x00\\x00", version <Q = 1, dtype code <B, sequence count <Q, document count <Q, then int32
sequence lengths, int64 byte pointers, int64 document indices. tests/integration/data/test_megatron.py checks
this reader against files megatron-core's own IndexedDatasetBuilder wrote.
"""
from __future__ import annotations

import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
INTEGER_CODES = (1, 2, 3, 4, 5, 8)


class MegatronError(ValueError):
    """An .idx/.bin pair that cannot be used."""


def paths(prefix: str) -> tuple[str, str]:
    return prefix + ".bin", prefix + ".idx"


def read_index(prefix: str) -> dict:
    """The .idx header and the total token count (from the sequence lengths; the .bin is not touched)."""
    _, idx = paths(prefix)
    try:
        with open(idx, "rb") as f:
            header = f.read(34)
    except OSError as e:
        raise MegatronError(f"{idx}: cannot read ({e.strerror or e})") from None
    if len(header) < 34 or header[:9] != MAGIC:
        raise MegatronError(f"{idx}: not a Megatron index (no MMIDIDX header)")
    version, code, sequences, documents = struct.unpack("<QBQQ", header[9:])
    if version != 1:
        raise MegatronError(f"{idx}: index version {version}, this reader knows version 1")
    if code not in INTEGER_CODES:
        raise MegatronError(f"{idx}: dtype code {code} is not an integer token type")
    lengths = np.memmap(idx, dtype=np.int32, mode="r", offset=34, shape=(sequences,)) if sequences else []
    return {"dtype": np.dtype(DTYPES[code]), "sequences": sequences, "documents": max(documents - 1, 0),
            "tokens": int(np.sum(lengths, dtype=np.int64))}


def open_tokens(prefix: str) -> np.ndarray:
    """The .bin as a read-only memmap of token ids, after checking its size against the index."""
    index = read_index(prefix)
    bin_path, _ = paths(prefix)
    expected = index["tokens"] * index["dtype"].itemsize
    size = os.path.getsize(bin_path) if os.path.isfile(bin_path) else None
    if size != expected:
        raise MegatronError(f"{bin_path} is {'missing' if size is None else f'{size} bytes'}; "
                            f"its index says {expected} bytes")
    if expected == 0:
        raise MegatronError(f"{bin_path} holds no tokens")
    return np.memmap(bin_path, dtype=index["dtype"], mode="r")
