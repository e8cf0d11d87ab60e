"""`data=megatron`: a Megatron-LM indexed dataset, <prefix>.bin + <prefix>.idx (framework/data/megatron.py
reads the format)."""
from __future__ import annotations

import os

from framework.data import megatron
from framework.data.sources.base import DataError, Source, Stream
from framework.errors import ConfigError


class Megatron(Source):
    name = "megatron"
    path_names = "prefix"
    vocab_from_data = True

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        path = data_cfg.path
        if not os.path.isfile(path + ".idx") or not os.path.isfile(path + ".bin"):
            hint = (f"; give the prefix without the extension: {path[:-4]}" if path.endswith((".bin", ".idx"))
                    else "")
            raise ConfigError("data.path", f"no {path}.bin and {path}.idx{hint}")

    def streams(self, data_cfg) -> list[Stream]:
        try:
            return [Stream(data_cfg.path, megatron.open_tokens(data_cfg.path))]
        except megatron.MegatronError as e:
            raise DataError(f"data.path: {e}") from None
