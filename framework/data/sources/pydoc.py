"""`data=pydoc`: the embedded default, the English documentation CPython ships (pydoc_data), as bytes."""
from __future__ import annotations

import numpy as np

from framework.data.sources.base import Source, Stream


def _topics() -> list[bytes]:
    from pydoc_data.topics import topics
    return [topics[key].encode("utf-8") for key in sorted(topics)]


def pydoc_corpus_bytes() -> bytes:
    """The English documentation text CPython ships in its standard library (pydoc_data)."""
    return b"\n\n".join(_topics())


class Pydoc(Source):
    name = "pydoc"
    byte_level = True

    def streams(self, data_cfg) -> list[Stream]:
        """The topics back to back; each topic (with the blank line after it) is a document."""
        lengths = [len(t) + 2 for t in _topics()]
        lengths[-1] -= 2
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return [Stream(self.name, np.frombuffer(pydoc_corpus_bytes(), dtype=np.uint8), starts=starts)]
