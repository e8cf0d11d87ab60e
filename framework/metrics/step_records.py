"""metrics.jsonl's records, one per logged step: `start` gathers what the step produced (loss, lr,
grad_norm), the peak memory since the last record, the strategy's own numbers, every rank's GPU health
(framework/metrics/gpu_health.py) and any extras; `write` adds the interval's timing, tokens/s and MFU and
logs it; `finish` ends the run (rank 0) with the lines of framework/metrics/summary.py over the records
this run wrote, which the trackers keep too. Peak memory restarts after each record and after each
checkpoint save (staging is not a training step's memory). tokens/s counts the tokens of the interval's
steps, as the training data counts them (data/batches.py: every position of a row, or one example a row, the
examples' own tokens), whose global batches differ during a batch-size ramp (framework/data/ramp.py). The
run's first record also holds what data.seq_len cut of the data's examples (data/examples.py), once."""
from __future__ import annotations

import sys

from framework.metrics.gpu_health import GpuHealth
from framework.metrics.logger import MetricsLogger
from framework.metrics.memory import IntervalPeakMemory
from framework.metrics.mfu import mfu, peak_flops
from framework.metrics.registry import registered_metrics
from framework.metrics.summary import run_summary


class StepRecords:
    def __init__(self, cfg, strategy, run_dir: str, flops_per_token: float, initial_step: int, data,
                 on_record=None, again: bool = False):
        """`data`: the training sampler (data/batches.py), which counts the tokens of steps and what was cut;
        `again`: a resumed or continued attempt, which redoes what a failed one logged past `initial_step`."""
        self.on_record = on_record
        self.cfg, self.strategy, self.run_dir, self.first_step = cfg, strategy, run_dir, initial_step
        self.data, self.once = data, dict(data.cut)
        self.last_logged = initial_step
        self.logged_tokens = 0
        self.flops_per_token = flops_per_token
        self.peak = peak_flops(strategy.device, cfg.logging, cfg.precision)
        self.memory = IntervalPeakMemory(strategy.device)
        self.memory.reset()
        self.health = GpuHealth(strategy.device, strategy.local_rank, cfg.logging.gpu_health)
        self.logger = MetricsLogger(cfg, run_dir, strategy.is_main, cfg.trainer.max_steps, initial_step, again)
        self.finished = False

    def start(self, step: int, loss: float, lr: float, grad_norm: float, *extras: dict) -> dict:
        s = self.strategy
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "world_size": s.world_size,
                  **self.memory.read(), **s.memory_breakdown(), **s.step_metrics(), **registered_metrics(s),
                  **self.health.read(), **self.once}
        self.once = {}
        for extra in extras:
            record.update(extra)
        return record

    def write(self, record: dict, timing: dict) -> None:
        steps = record["step"] - self.last_logged
        tokens = self.data.tokens(self.last_logged, record["step"])
        tokens_per_sec = tokens / (timing["step_time"] * steps)
        self.last_logged, self.logged_tokens = record["step"], self.logged_tokens + tokens
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

    def finish(self, wall_seconds: float, last_step: int, totals: dict) -> None:
        """The run reached its last step: print the summary (rank 0) and hand it to the trackers."""
        if self.strategy.is_main:
            tokens = self.logged_tokens + self.data.tokens(self.last_logged, last_step)
            text, values = run_summary(self.cfg, self.run_dir, wall_seconds, self.first_step, last_step,
                                       {**totals, "tokens": tokens})
            print(text, flush=True)
            self.logger.log_summary(values)
        self.finished = True

    def close(self) -> None:
        """Called from the trainer's `finally`; a run that did not finish marks its tracker runs stopped."""
        self.logger.close(finished=self.finished and sys.exc_info()[1] is None)
