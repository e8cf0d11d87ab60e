"""Which complete checkpoints stay after a save: the newest `checkpoint.keep_last`, and with `checkpoint.keep_best`
the best by `checkpoint.score` (a metric of the step's record, e.g. val_loss; lower is better unless
`checkpoint.score_mode=max`) among those that recorded one. Everything else is deleted."""
from __future__ import annotations

from typing import NamedTuple, Optional

SCORE_MODES = ("min", "max")


class Saved(NamedTuple):
    step: int
    score: Optional[float]     # checkpoint.score at that step; None where the step had none (not evaluated)


def kept_steps(saved: list[Saved], keep_last: int, keep_best: int = 0, mode: str = "min") -> set[int]:
    """The steps whose checkpoints stay."""
    newest = sorted(s.step for s in saved)[-keep_last:] if keep_last > 0 else []
    scored = [s for s in saved if s.score is not None]
    sign = 1 if mode == "min" else -1
    best = sorted(scored, key=lambda s: (sign * s.score, -s.step))[:keep_best]     # ties: the newer one
    return set(newest) | {s.step for s in best}


def score_of(record: Optional[dict], key: Optional[str]) -> Optional[float]:
    """The score a save records: `key` of the step's metrics record, if it has a finite number there."""
    if not record or not key or not isinstance(record.get(key), (int, float)):
        return None
    value = float(record[key])
    return value if value == value and abs(value) != float("inf") else None
