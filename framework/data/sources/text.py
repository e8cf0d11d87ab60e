"""`data=text`: any UTF-8 or byte text file, its bytes the tokens."""
from __future__ import annotations

import os

import numpy as np

from framework.data.sources.base import Source, Stream
from framework.errors import ConfigError


class Text(Source):
    name = "text"
    path_names = "file"
    byte_level = True

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        if not os.path.isfile(data_cfg.path):
            raise ConfigError("data.path", f"no such file: {data_cfg.path}")

    def streams(self, data_cfg) -> list[Stream]:
        with open(data_cfg.path, "rb") as f:
            return [Stream(self.name, np.frombuffer(f.read(), dtype=np.uint8))]
