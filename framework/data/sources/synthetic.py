"""`data=synthetic`: uniform random tokens, for throughput benchmarks; no file needed."""
from __future__ import annotations

import numpy as np

from framework.data.sources.base import Source, Stream

SEED = 12345


class Synthetic(Source):
    name = "synthetic"

    def streams(self, data_cfg) -> list[Stream]:
        rng = np.random.default_rng(SEED)
        return [Stream(self.name, rng.integers(0, data_cfg.vocab_size, size=data_cfg.num_tokens, dtype=np.int64))]
