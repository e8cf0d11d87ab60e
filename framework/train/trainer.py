"""The training loop. It knows the config and the Strategy interface, never which strategy runs."""
from __future__ import annotations

import time

import torch

from framework.checkpoint.manager import CheckpointManager
from framework.config.schema import Config
from framework.data.batches import build_samplers
from framework.data.prefetch import BatchPrefetcher
from framework.data.tokenizer import of_data
from framework.metrics.compile_stats import CompileWatch
from framework.metrics.interval import LogInterval
from framework.metrics.profile import StepProfiler
from framework.metrics.samples import TextSampler
from framework.metrics.schedule import plan_step
from framework.metrics.step_records import StepRecords
from framework.models.factory import ModelFactory
from framework.objectives.registry import objective_of
from framework.optim.factory import OptimizerFactory
from framework.optim.schedulers import build_scheduler
from framework.runtime import faults
from framework.runtime.elastic import group_continues
from framework.runtime.preemption import PreemptionWatch
from framework.runtime.watchdog import StallWatchdog
from framework.train.nonfinite import NonFiniteLoss
from framework.train.reference import ReferencePass
from framework.train.step_batches import StepBatches
from framework.train.task_scores import TaskScores


class Trainer:
    def __init__(self, cfg: Config, strategy, run_dir: str, on_record=None):
        self.cfg = cfg
        self.strategy = strategy
        self.on_record = on_record      # every rank's view of each metrics record (framework.train.worker.run_worker)
        self.run_dir = strategy.run_dir = run_dir   # strategies that write files of their own put them here
        t = cfg.trainer
        self.objective = objective_of(cfg)
        self.batches = StepBatches(cfg, strategy, self.objective)
        self.task_scores = TaskScores(cfg, strategy, self.batches)
        self.train_data, self.val_data = build_samplers(cfg.data, self.batches.sizes, cfg.seed,
                                                        with_val=bool(t.eval_every))
        self.text_sampler = (TextSampler(of_data(cfg.data), t.sample_prompt, t.sample_tokens, cfg.data.seq_len,
                                         t.global_batch_size, cfg.seed) if t.sample_every else None)
        self.step = 0

    def _local_batch(self, sampler, step: int):
        s = self.strategy
        return sampler.local_batch(step, s.dp_rank, s.dp_size) if s.needs_batches else None

    def _local_micro_batches(self, sampler, step: int):
        """A batch of the final global size (evaluation, samples), as micro-batches."""
        self.batches.plan(self.batches.layout)
        return self.batches.micro_batches(self._local_batch(sampler, step), self.batches.layout)

    def evaluate(self) -> float:
        losses = []
        for i in range(self.cfg.trainer.eval_batches):
            with self.batches.global_batch(self.val_data, i):
                losses.append(self.strategy.eval_loss(self._local_micro_batches(self.val_data, i), self.objective))
        return float(torch.stack(losses).mean())

    def sample_text(self) -> str:
        return self.text_sampler.run(self.step, lambda source: self.strategy.eval_loss(
            self._local_micro_batches(source, self.step), source.pick))

    def fit(self) -> None:
        cfg, s, t = self.cfg, self.strategy, self.cfg.trainer
        started = time.perf_counter()
        model_factory = ModelFactory(cfg)
        s.setup(model_factory, OptimizerFactory(cfg.optimizer, model_factory.spec.output_heads()),
                lambda opt: build_scheduler(opt, cfg.scheduler, t.max_steps))
        self.batches.reference = ReferencePass(cfg, s, self.objective, model_factory)
        checkpoints = CheckpointManager(cfg, self.run_dir, s)
        continues = group_continues(self.run_dir, s.device)
        resume_from = checkpoints.to_resume(continues, announce=s.is_main)
        self.batches.reference.precompute(self.batches, checkpoints, resume_from, train=self.train_data,
                                          val=self.val_data)
        self.step = checkpoints.load(resume_from) if resume_from else 0     # 0: nothing to resume
        records = StepRecords(cfg, s, self.run_dir, model_factory.flops_per_token(cfg.data.seq_len), self.step,
                              self.train_data, self.on_record, again=bool(self.step or continues))
        faults.inject("startup", self.step)
        watchdog = StallWatchdog(self.run_dir, s.rank, t.stall_timeout_s).start()
        preemption = PreemptionWatch(cfg.launcher.preempt_signals, s.device)
        profiler = StepProfiler(t.profile, self.run_dir, s.rank, s.device)
        prefetch = BatchPrefetcher(lambda step: self._local_batch(self.train_data, step))
        compiles = CompileWatch(t.compile, s.is_main)
        nonfinite = NonFiniteLoss(t.on_nonfinite)
        interval = LogInterval()    # the loop's wall time, one record at a time (what step_time covers)
        try:
            last_step = min(t.max_steps, t.stop_at_step or t.max_steps)
            while self.step < last_step:
                step = self.step + 1
                is_last, do_eval, do_tasks, do_sample, logs = plan_step(t, step, last_step, self.task_scores.every)
                with interval.timed_apart("profile_time"):
                    profiler.before_step(step)
                start = time.perf_counter()
                with compiles.step(step, interval):
                    local = prefetch.get(self.step)
                    interval.step(data_time=time.perf_counter() - start)
                    with self.batches.global_batch(self.train_data, self.step):
                        loss = self.batches.forward_backward(step, local)
                    faults.inject("step", step)
                    lr = s.current_lr()
                    finite, grad_norm = nonfinite.update(s, loss, step, t.grad_clip)
                    if logs:
                        loss, grad_norm = float(loss), float(grad_norm)
                self.step = step
                records.advance()
                if logs:
                    nonfinite.check()
                    record = records.start(step, loss, lr, grad_norm,
                                           model_factory.spec.step_metrics(s.unwrapped_model()),
                                           self.train_data.consumed(step), compiles.record(),
                                           self.batches.record(step))
                    with interval.timed_apart("eval_time"):
                        if do_eval:
                            faults.inject("eval", step)
                            record["val_loss"] = self.evaluate()
                        if do_sample:
                            record["sample"] = self.sample_text()
                    self.task_scores.add_to(record, interval, due=do_tasks)
                saved = finite and checkpoints.should_save(step, is_last)
                if saved:
                    nonfinite.check()    # never write a non-finite state
                    with interval.timed_apart("save_time"):
                        checkpoints.save(step, record if logs else None)
                    records.saved()
                if logs:
                    timing = interval.record()
                    prefetch.observe(timing["data_time"], timing["step_time"])
                    records.write(record, timing)
                watchdog.beat(step)
                if is_last:
                    break
                faults.inject("between", step)
                preemption.stop_if_requested(step, lambda: checkpoints.save_unless_saved(step, saved, nonfinite.check))
            totals = interval.totals()
            preemption.finish()
            checkpoints.finish()
            records.finish(time.perf_counter() - started, self.step, totals)
        finally:
            prefetch.close()
            profiler.close()
            watchdog.stop()
            preemption.close()
            records.close()
