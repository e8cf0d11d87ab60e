"""`data=chat`: conversations (`messages` with roles, or prompt/completion pairs) from JSONL or Parquet files or
through Hugging Face datasets (each input read by the source that reads its kind), rendered with the
tokenizer's chat template or data.chat_template, the loss masked to data.train_on (framework/data/chat.py);
prepared at launch."""
from __future__ import annotations

import os
from typing import Iterator, Optional

from framework.data.documents import DocumentError, expand_inputs
from framework.data.sources.base import Source
from framework.data.sources.prepared import PreparedSource


def _reader(path: str) -> Optional[Source]:
    """The source that reads chat records of this input's kind: a file's format, a saved dataset dir, or (a path
    that does not exist but looks like one) a Hub dataset id."""
    from framework.data.sources import reader_for, source_named
    from framework.data.sources.datasets import HUB_ID
    found = reader_for(path)
    if found is None and not os.path.exists(path) and HUB_ID.fullmatch(path):
        found = source_named("datasets")
    return found


class Chat(PreparedSource):
    name = "chat"
    path_names = "file, dataset dir or Hub dataset id"
    chat_only = True

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        for path in self.expand([data_cfg.path]):
            reader = _reader(path)
            if reader is not None:
                reader.check_installed("data.path", path)

    def expand(self, inputs: list[str]) -> list[str]:
        out = []
        for item in inputs:
            reader = _reader(item)
            out += reader.expand([item]) if isinstance(reader, PreparedSource) else expand_inputs([item])
        return out

    def records(self, path: str, columns: list[str] | None = None,
                split: str = "train") -> Iterator[tuple[str, object]]:
        reader = _reader(path)
        if reader is None:
            raise DocumentError(f"{path}: not a chat data file (.jsonl, .parquet) or a saved dataset dir")
        return reader.records(path, columns, split=split)
