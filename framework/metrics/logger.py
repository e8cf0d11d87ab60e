"""metrics.jsonl, TensorBoard events and the progress bar; active on the main rank only."""
from __future__ import annotations

import json
import os


class MetricsLogger:
    def __init__(self, run_dir: str, enabled: bool, tensorboard: bool, progress_bar: bool, total_steps: int,
                 initial_step: int = 0):
        self.enabled = enabled
        self.writer = None
        self.bar = None
        if not enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self.file = open(os.path.join(run_dir, "metrics.jsonl"), "a", buffering=1)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])
                elif isinstance(value, str):
                    self.writer.add_text(key, value, record["step"])
        for key, value in record.items():
            if isinstance(value, str):
                print(f"step {record['step']} {key}: {value!r}", flush=True)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                                 tok_s=f"{record['tokens_per_sec']:.0f}", refresh=False)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()
        self.file.close()


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
