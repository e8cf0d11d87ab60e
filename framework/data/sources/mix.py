"""`data=mix`: a weighted mixture of token sources (prepared dataset dirs, Megatron prefixes, flat token
files), one stream per entry of data.sources; framework/data/mixture.py deals the global batch out."""
from __future__ import annotations

import os

from framework.data.mixture import BLOCK, block_counts
from framework.data.sources.base import Source, Stream, open_path, path_kind
from framework.errors import ConfigError


def source_name(source_cfg) -> str:
    return source_cfg.name or os.path.basename(os.path.normpath(source_cfg.path))


class Mix(Source):
    name = "mix"
    vocab_from_data = True
    mixture = True

    def check(self, data_cfg) -> None:
        sources = data_cfg.sources
        if not sources:
            raise ConfigError("data.sources", "is empty; give data.sources=[{path: A, weight: 0.7}, "
                                              "{path: B, weight: 0.3}]")
        for i, source in enumerate(sources):
            if source.weight <= 0:
                raise ConfigError(f"data.sources[{i}].weight", f"must be positive, got {source.weight}")
            if path_kind(source.path) is None:
                raise ConfigError(f"data.sources[{i}].path", f"no such file, dataset dir or Megatron prefix: "
                                                             f"{source.path}")
        names = [source_name(s) for s in sources]
        if len(set(names)) != len(names):
            raise ConfigError("data.sources", f"two sources are named alike ({', '.join(names)}); give each a name")
        for i, count in enumerate(block_counts([s.weight for s in sources])):
            if count == 0:
                raise ConfigError(f"data.sources[{i}].weight", f"{sources[i].weight} is too small a share to draw "
                                                               f"one sequence in {BLOCK}; raise it or drop the source")

    def dataset_dirs(self, data_cfg) -> list[tuple[str, str]]:
        return [(f"data.sources[{i}].path", s.path) for i, s in enumerate(data_cfg.sources) if os.path.isdir(s.path)]

    def streams(self, data_cfg) -> list[Stream]:
        out = []
        for i, source in enumerate(data_cfg.sources):
            stream = open_path(source.path, data_cfg, f"data.sources[{i}].path")
            stream.name, stream.weight = source_name(source), source.weight
            out.append(stream)
        return out
