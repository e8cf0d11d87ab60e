"""Which training steps evaluate, score benchmark tasks, sample text and write a metrics record (`trainer.*_every`,
`eval.every`).

The last step always evaluates and scores (when they are on) and logs; the first step always logs; a step that
evaluates, scores or samples logs, so its val_loss, scores or sample have a record to go in."""
from __future__ import annotations

from typing import NamedTuple


class StepPlan(NamedTuple):
    is_last: bool
    evaluate: bool
    tasks: bool
    sample: bool
    logs: bool


def plan_step(trainer_cfg, step: int, last_step: int, tasks_every: int = 0) -> StepPlan:
    """`tasks_every`: steps between benchmark scores (0: none)."""
    t = trainer_cfg
    is_last = step == last_step
    evaluate = bool(t.eval_every) and (step % t.eval_every == 0 or is_last)
    tasks = bool(tasks_every) and (step % tasks_every == 0 or is_last)
    sample = bool(t.sample_every) and step % t.sample_every == 0
    return StepPlan(is_last, evaluate, tasks, sample,
                    evaluate or tasks or sample or is_last or step == 1 or step % t.log_every == 0)
