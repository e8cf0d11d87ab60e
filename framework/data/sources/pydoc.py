"""`data=pydoc`: the embedded default, the English documentation CPython ships (pydoc_data), as bytes."""
from __future__ import annotations

import numpy as np

from framework.data.sources.base import Source, Stream


def pydoc_corpus_bytes() -> bytes:
    """The English documentation text CPython ships in its standard library (pydoc_data)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


class Pydoc(Source):
    name = "pydoc"
    byte_level = True

    def streams(self, data_cfg) -> list[Stream]:
        return [Stream(self.name, np.frombuffer(pydoc_corpus_bytes(), dtype=np.uint8))]
