"""metrics.jsonl's records, one per logged step: `start` gathers what the step produced (loss, lr,
grad_norm), the peak memory since the last record, the strategy's own numbers and any extras; `write`
adds the interval's timing, tokens/s and MFU and logs it; `print_summary` ends the run (rank 0) with the
lines of framework/metrics/summary.py over the records this run wrote. Peak memory restarts after each record and
after each checkpoint save (staging is not a training step's memory)."""
from __future__ import annotations

from framework.metrics.logger import MetricsLogger
from framework.metrics.memory import IntervalPeakMemory
from framework.metrics.mfu import mfu, peak_flops
from framework.metrics.summary import run_summary


class StepRecords:
    def __init__(self, cfg, strategy, run_dir: str, flops_per_token: float, initial_step: int, on_record=None):
        t = cfg.trainer
        self.on_record = on_record
        self.cfg, self.strategy, self.run_dir, self.first_step = cfg, strategy, run_dir, initial_step
        self.tokens_per_step = t.global_batch_size * cfg.data.seq_len
        self.flops_per_token = flops_per_token
        self.peak = peak_flops(strategy.device, cfg.logging, cfg.precision)
        self.memory = IntervalPeakMemory(strategy.device)
        self.memory.reset()
        self.logger = MetricsLogger(run_dir, strategy.is_main, cfg.logging.tensorboard, t.progress_bar, t.max_steps,
                                    initial_step=initial_step)

    def start(self, step: int, loss: float, lr: float, grad_norm: float, *extras: dict) -> dict:
        s = self.strategy
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "world_size": s.world_size,
                  **self.memory.read(), **s.memory_breakdown(), **s.step_metrics()}
        for extra in extras:
            record.update(extra)
        return record

    def write(self, record: dict, timing: dict) -> None:
        tokens_per_sec = self.tokens_per_step / timing["step_time"]
        full = {**record, **timing, "tokens_per_sec": tokens_per_sec,
                "mfu": mfu(self.flops_per_token, tokens_per_sec, self.peak, self.strategy.world_size)}
        self.logger.log(full)
        if self.on_record is not None:
            self.on_record(full)
        self.memory.reset()

    def saved(self) -> None:
        self.memory.reset()

    def advance(self) -> None:
        self.logger.advance()

    def close(self) -> None:
        self.logger.close()

    def print_summary(self, wall_seconds: float, last_step: int, totals: dict) -> None:
        if self.strategy.is_main:
            print(run_summary(self.cfg, self.run_dir, wall_seconds, self.first_step, last_step, totals), flush=True)
