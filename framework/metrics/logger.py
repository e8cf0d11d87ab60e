"""metrics.jsonl (every record, always), the experiment trackers of logging.trackers and the progress bar;
active on the main rank only."""
from __future__ import annotations

import json
import os

from framework.metrics.trackers import Trackers


class MetricsLogger:
    def __init__(self, cfg, run_dir: str, enabled: bool, total_steps: int, initial_step: int = 0,
                 again: bool = False):
        """`again`: a resumed or continued attempt: the records a failed one logged past `initial_step` are dropped
        (with no checkpoint: all of them), as those steps are trained again."""
        self.enabled = enabled
        self.bar = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        if again:
            truncate_metrics(run_dir, after_step=initial_step)
        self.file = open(os.path.join(run_dir, "metrics.jsonl"), "a", buffering=1)
        self.trackers = Trackers(cfg, run_dir)
        if cfg.trainer.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.trackers.log(record)
        for key, value in record.items():
            if isinstance(value, str):
                print(f"step {record['step']} {key}: {value!r}", flush=True)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                                 tok_s=f"{record['tokens_per_sec']:.0f}", refresh=False)

    def log_summary(self, summary: dict) -> None:
        if self.enabled:
            self.trackers.log_summary(summary)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self, finished: bool) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        self.file.close()
        self.trackers.close(finished)


def truncate_metrics(run_dir: str, after_step: int) -> None:
    """On resume, drop records a crashed attempt logged past the checkpoint, so each step appears once."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= after_step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):   # blank, or cut short by a kill mid-write
                pass
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def final_value(run_dir: str, key: str) -> float | None:
    """The last value of `key` in the run's metrics.jsonl (None if it never logged one)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    value = None
    with open(path) as f:
        for line in f:
            if line.strip() and key in (record := json.loads(line)):
                value = record[key]
    return value
