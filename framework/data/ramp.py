"""The global batch size of every step: constant, or ramped up as Megatron's --rampup-batch-size does.

A ramp [start, increment, samples] to a final size F starts at `start` sequences a step and grows by
`increment` each time another samples / ((F - start) / increment) sequences have been consumed, until
`samples` sequences are; from then on every step takes F. The size of a step depends only on the sequences
consumed before it, which depend only on the earlier steps' sizes: so step k's size and its offset in the
endless order of sequences (the sum of the earlier sizes) depend on k alone, whatever the layout, and a
resumed run takes the same batches as an uninterrupted one.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Sequence


class BatchSizes:
    def __init__(self, final: int, rampup: Sequence[int] | None = None):
        self.final = final
        self._ramp: list[int] = []           # the sizes of the ramp's steps (0-based), before `final` holds
        if rampup:
            start, increment, samples = (int(v) for v in rampup)
            increments = (final - start) // increment
            consumed = 0
            while consumed <= samples:
                # Megatron: int(consumed / (samples / increments)), here in integers
                size = min(final, start + consumed * increments // samples * increment)
                self._ramp.append(size)
                consumed += size
        self._offsets = [0, *accumulate(self._ramp)]

    @classmethod
    def of(cls, sizes: "BatchSizes | int") -> "BatchSizes":
        return sizes if isinstance(sizes, BatchSizes) else cls(int(sizes))

    @property
    def ramp_steps(self) -> int:
        """Steps before the final size holds."""
        return len(self._ramp)

    def size(self, step: int) -> int:
        """Sequences in step `step` (0-based)."""
        return self._ramp[step] if step < len(self._ramp) else self.final

    def offset(self, step: int) -> int:
        """Sequences consumed by the steps before step `step` (0-based): where its batch starts."""
        if step <= len(self._ramp):
            return self._offsets[step]
        return self._offsets[-1] + (step - len(self._ramp)) * self.final

    def distinct(self) -> list[int]:
        """Every size a step takes, smallest first."""
        return sorted({*self._ramp, self.final})
