"""`data=text`: any UTF-8 or byte text file, its bytes the tokens."""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from framework.data.sources.base import Source, Stream
from framework.errors import ConfigError


class Text(Source):
    name = "text"
    path_names = "file"
    byte_level = True
    fallback_reader = True      # `prepare`: a file no other source reads is one text document

    def reads(self, path: str) -> bool:
        return os.path.isfile(path)

    def records(self, path: str, columns: list[str] | None = None,
                split: str = "train") -> Iterator[tuple[str, object]]:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield path, f.read()

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        if not os.path.isfile(data_cfg.path):
            raise ConfigError("data.path", f"no such file: {data_cfg.path}")

    def streams(self, data_cfg) -> list[Stream]:
        with open(data_cfg.path, "rb") as f:
            tokens = np.frombuffer(f.read(), dtype=np.uint8)
        return [Stream(self.name, tokens, starts=np.array([0, len(tokens)], dtype=np.int64))]   # one document
