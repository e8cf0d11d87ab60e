"""`data=tokens`: a prepared dataset dir (`python -m framework.data.prepare`) or a flat file of token ids,
read through memory maps."""
from __future__ import annotations

import os

from framework.data.sources.base import Source, Stream, open_path
from framework.errors import ConfigError


class Tokens(Source):
    name = "tokens"
    path_names = "file"
    vocab_from_data = True

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        if not os.path.exists(data_cfg.path):
            raise ConfigError("data.path", f"no such file or dataset dir: {data_cfg.path}")

    def dataset_dirs(self, data_cfg) -> list[tuple[str, str]]:
        return [("data.path", data_cfg.path)] if data_cfg.path and os.path.isdir(data_cfg.path) else []

    def streams(self, data_cfg) -> list[Stream]:
        return [open_path(data_cfg.path, data_cfg)]
