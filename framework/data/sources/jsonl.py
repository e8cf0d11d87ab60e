"""`data=jsonl`: JSON Lines files, one record a line (text documents in data.text_key, or chat records),
prepared into a dataset at launch. `prepare` reads .jsonl / .json / .ndjson inputs through it."""
from __future__ import annotations

import json
from typing import Iterator

from framework.data.documents import DocumentError
from framework.data.sources.prepared import PreparedSource

EXTENSIONS = (".jsonl", ".json", ".ndjson")


class Jsonl(PreparedSource):
    name = "jsonl"

    def reads(self, path: str) -> bool:
        return path.endswith(EXTENSIONS)

    def records(self, path: str, columns: list[str] | None = None,
                split: str = "train") -> Iterator[tuple[str, object]]:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DocumentError(f"{where}: not JSON ({e.msg})") from None
                if not isinstance(record, dict):
                    raise DocumentError(f"{where}: a JSON {type(record).__name__}, not an object")
                yield where, record
