"""Where a training loop's wall time goes, one log interval at a time.

An interval runs from the end of the previous record to the end of this one; the trainer ends it after
the logged step has read its loss (which waits for the device), so it holds all that the device did for
its steps. Its step time is the interval's wall time, less what was set apart (evaluation and samples,
checkpoint saves, compilation, writing a profiler trace: each reported under its own key), divided by
its steps (tasks_time: benchmark scores, eval.tasks). Nothing in between is lost: on a GPU an unlogged step only queues work, and the host waits
for the device wherever it next reads a value (the preemption vote), outside any one step's code.
The intervals together cover the whole loop: `totals()` gives the loop's wall time and its parts.
"""
from __future__ import annotations

import contextlib
import time

APART = ("eval_time", "tasks_time", "save_time", "compile_time", "profile_time")


class LogInterval:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.started = self.mark = clock()
        self.total_steps, self.total_apart = 0, dict.fromkeys(APART, 0.0)
        self._reset()

    def _reset(self) -> None:
        self.steps, self.data_time, self.apart = 0, 0.0, dict.fromkeys(APART, 0.0)

    def step(self, data_time: float) -> None:
        """A training step ran; `data_time` of it went to producing its batch."""
        self.steps += 1
        self.data_time += data_time

    def set_apart(self, key: str, seconds: float) -> None:
        self.apart[key] += seconds

    @contextlib.contextmanager
    def timed_apart(self, key: str):
        start = self.clock()
        try:
            yield
        finally:
            self.set_apart(key, self.clock() - start)

    def record(self) -> dict[str, float]:
        """Ends the interval: mean step and data time per step, and the seconds set apart."""
        now = self.clock()
        wall, self.mark = now - self.mark, now
        n = max(1, self.steps)
        out = {"step_time": max((wall - sum(self.apart.values())) / n, 1e-9), "data_time": self.data_time / n,
               **self.apart}
        self.total_steps += self.steps
        for key, seconds in self.apart.items():
            self.total_apart[key] += seconds
        self._reset()
        return out

    def totals(self) -> dict[str, float]:
        """The loop so far (called when it ends): its wall time since this object was made, the steps
        recorded, what they took by the records (their step times summed), and each part set apart."""
        return {"loop_time": self.clock() - self.started, "steps": self.total_steps,
                "train_time": self.mark - self.started - sum(self.total_apart.values()), **self.total_apart}
