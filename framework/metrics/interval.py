"""Step and data time since the last logged record. A record reports their mean per step: on a GPU a
step that is not logged never waits for the device, so its own wall time is only the time to queue
its work, and only the logged step (which ends by reading the loss) waits for what was queued before."""
from __future__ import annotations


class LogInterval:
    def __init__(self):
        self.reset()

    def add(self, step_time: float, data_time: float) -> None:
        self.steps += 1
        self.step_time += step_time
        self.data_time += data_time

    def record(self) -> dict[str, float]:
        n = max(1, self.steps)
        return {"step_time": max(self.step_time / n, 1e-9), "data_time": self.data_time / n}

    def reset(self) -> None:
        self.steps, self.step_time, self.data_time = 0, 0.0, 0.0
