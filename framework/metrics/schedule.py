"""Which training steps evaluate, sample text and write a metrics record (`trainer.*_every`).

The last step always evaluates (when evaluation is on) and logs; the first step always logs; a step that
evaluates or samples logs, so its val_loss or sample has a record to go in."""
from __future__ import annotations

from typing import NamedTuple


class StepPlan(NamedTuple):
    is_last: bool
    evaluate: bool
    sample: bool
    logs: bool


def plan_step(trainer_cfg, step: int, last_step: int) -> StepPlan:
    t = trainer_cfg
    is_last = step == last_step
    evaluate = bool(t.eval_every) and (step % t.eval_every == 0 or is_last)
    sample = bool(t.sample_every) and step % t.sample_every == 0
    return StepPlan(is_last, evaluate, sample, evaluate or sample or is_last or step == 1 or step % t.log_every == 0)
