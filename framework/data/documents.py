"""Documents out of the files a user brings: plain text, JSONL and Parquet.

A plain text file is one document; a JSONL line is one document (its `text_key` field); a Parquet
row is one document (its `text_key` column, read a row group at a time through pyarrow). Errors name
the file and, for JSONL, the line.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Iterator

JSONL = (".jsonl", ".json", ".ndjson")
PARQUET = (".parquet",)


class DocumentError(ValueError):
    """Input that cannot be read as documents; the message starts with `file[:line]`."""


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files, directories (every file below, sorted) and globs -> a sorted, de-duplicated file list."""
    files: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(item) for name in names
                           if not name.startswith("."))
        elif os.path.isfile(item):
            found = [item]
        else:
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
        if not found:
            raise DocumentError(f"{item}: no such file, or no files match")
        files += [p for p in found if p not in files]
    return files


def _jsonl(path: str, text_key: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DocumentError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or text_key not in record:
                raise DocumentError(f"{path}:{number}: no {text_key!r} key; pass --text-key with the field "
                                    f"that holds the text")
            text = record[text_key]
            if not isinstance(text, str):
                raise DocumentError(f"{path}:{number}: {text_key!r} is a {type(text).__name__}, not a string")
            yield text


def _parquet(path: str, text_key: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DocumentError(f"{path}: reading Parquet needs pyarrow: pip install 'framework[parquet]'") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:
        raise DocumentError(f"{path}: not a Parquet file ({str(e).splitlines()[0][:120]})") from None
    if text_key not in parquet.schema_arrow.names:
        raise DocumentError(f"{path}: no column {text_key!r} (columns: {', '.join(parquet.schema_arrow.names)}); "
                            f"pass --text-key")
    for group in range(parquet.num_row_groups):
        for text in parquet.read_row_group(group, columns=[text_key]).column(0).to_pylist():
            yield text or ""


def _text(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        yield f.read()


def read_documents(path: str, text_key: str) -> Iterator[str]:
    try:
        if path.endswith(JSONL):
            yield from _jsonl(path, text_key)
        elif path.endswith(PARQUET):
            yield from _parquet(path, text_key)
        else:
            yield from _text(path)
    except UnicodeDecodeError as e:
        raise DocumentError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise DocumentError(f"{path}: cannot read ({e.strerror or e})") from None


def all_documents(files: list[str], text_key: str) -> Iterator[str]:
    for path in files:
        yield from read_documents(path, text_key)
