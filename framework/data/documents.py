"""Records out of the inputs a user brings, for `prepare`: files, directories and globs, each read by the data
source that reads it (data/sources: jsonl, parquet, datasets, and text for any other file).

A record is a JSONL line, a Parquet row, a dataset row or a whole text file. A text document is one record's
`text_key` field (a text file is its own text); a chat record is a conversation (data/chat.py). Errors name
the file and, where there is one, the line or row.
"""
from __future__ import annotations

import glob
import os
from typing import Iterator


class DocumentError(ValueError):
    """Input that cannot be read as documents; the message starts with `file[:line]`."""


def _reads_whole(path: str) -> bool:
    """A directory that one source reads as a whole (a saved HF dataset) rather than file by file."""
    from framework.data.sources import reader_for
    return os.path.isdir(path) and reader_for(path) is not None


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files, directories (every file below, sorted; a saved dataset stays one input) and globs -> a sorted,
    de-duplicated input list."""
    files: list[str] = []
    for item in inputs:
        if os.path.isdir(item) and _reads_whole(item):
            found = [item]
        elif os.path.isdir(item):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(item) for name in names
                           if not name.startswith("."))
        elif os.path.isfile(item):
            found = [item]
        else:
            found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p) or _reads_whole(p))
        if not found:
            raise DocumentError(f"{item}: no such file, or no files match")
        files += [p for p in found if p not in files]
    return files


def text_of(where: str, record, text_key: str) -> str:
    """The text of a record: a whole text file's own, or its `text_key` field."""
    if isinstance(record, str):
        return record
    if not isinstance(record, dict) or text_key not in record:
        raise DocumentError(f"{where}: no {text_key!r} key; pass --text-key with the field that holds the text")
    text = record[text_key]
    if not isinstance(text, str):
        raise DocumentError(f"{where}: {text_key!r} is a {type(text).__name__}, not a string")
    return text


def read_records(path: str, columns: list[str] | None = None, reader=None,
                 split: str = "train") -> Iterator[tuple[str, object]]:
    """(where, record) of one input, read by `reader` (a data source) or the source that reads its kind; read
    errors become DocumentError."""
    from framework.data.sources import reader_for
    try:
        yield from (reader or reader_for(path, fallback=True)).records(path, columns, split=split)
    except UnicodeDecodeError as e:
        raise DocumentError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise DocumentError(f"{path}: cannot read ({e.strerror or e})") from None


def all_records(files: list[str], columns: list[str] | None = None) -> Iterator[tuple[str, object]]:
    for path in files:
        yield from read_records(path, columns)


def all_documents(files: list[str], text_key: str) -> Iterator[str]:
    for where, record in all_records(files, [text_key]):
        yield text_of(where, record, text_key)
