"""TensorBoard event files under <run dir>/tensorboard (a resumed run appends a new events file there)."""
from __future__ import annotations

import os

from framework.metrics.trackers.base import Tracker

DIR = "tensorboard"


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    package = "tensorboard"

    def start(self, cfg, run_dir: str, run_id: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(run_dir, DIR))
        return None

    def log(self, step: int, metrics: dict[str, float], texts: dict[str, str]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        for key, value in texts.items():
            self.writer.add_text(key, value, step)

    def log_summary(self, summary: dict) -> None:
        self.writer.add_text("summary", "\n".join(f"    {k}: {v}" for k, v in summary.items()))

    def close(self, finished: bool) -> None:
        self.writer.close()
