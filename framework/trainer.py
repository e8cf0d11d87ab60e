"""The training loop. It knows the config and the Strategy interface, never which strategy runs."""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from framework.checkpoint.manager import CheckpointManager, resolve_resume
from framework.data.batches import GlobalBatchSampler, micro_batches, split_train_val
from framework.data.sources import load_tokens
from framework.metrics.logger import MetricsLogger, truncate_metrics
from framework.metrics.memory import peak_memory_gb
from framework.metrics.mfu import mfu, peak_flops
from framework.models.factory import ModelFactory
from framework.optim.factory import OptimizerFactory
from framework.optim.schedulers import build_scheduler


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def build_model(cfg) -> torch.nn.Module:
    """Same seed -> same initial weights, whatever the layout (see ModelFactory)."""
    return ModelFactory(cfg)()


class Trainer:
    def __init__(self, cfg, strategy, run_dir: str):
        self.cfg = cfg
        self.strategy = strategy
        self.run_dir = strategy.run_dir = run_dir   # strategies that write files of their own put them here
        t = cfg.trainer
        train_tokens, val_tokens = split_train_val(load_tokens(cfg.data), cfg.data.val_fraction)
        self.train_data = GlobalBatchSampler(train_tokens, cfg.data.seq_len, t.global_batch_size, cfg.seed)
        self.val_data = (GlobalBatchSampler(val_tokens, cfg.data.seq_len, t.global_batch_size, cfg.seed,
                                            shuffle=False) if t.eval_every else None)
        self.step = 0

    def _local_micro_batches(self, sampler: GlobalBatchSampler, step: int):
        s = self.strategy
        if not s.needs_batches:
            return []
        return micro_batches(sampler.local_batch(step, s.dp_rank, s.dp_size), self.cfg.trainer.micro_batch_size)

    def evaluate(self) -> float:
        losses = [self.strategy.eval_loss(self._local_micro_batches(self.val_data, i), cross_entropy)
                  for i in range(self.cfg.trainer.eval_batches)]
        return float(torch.stack(losses).mean())

    def fit(self) -> None:
        cfg, s, t = self.cfg, self.strategy, self.cfg.trainer
        model_factory = ModelFactory(cfg)
        s.setup(model_factory, OptimizerFactory(cfg.optimizer),
                lambda opt: build_scheduler(opt, cfg.scheduler, t.max_steps))
        checkpoints = CheckpointManager(cfg, self.run_dir, s)
        resume = resolve_resume(cfg, self.run_dir)
        if resume:
            self.step = checkpoints.load(resume)
            if s.is_main:
                truncate_metrics(self.run_dir, after_step=self.step)
        tokens_per_step = t.global_batch_size * cfg.data.seq_len
        flops_per_token = model_factory.flops_per_token(cfg.data.seq_len)
        peak = peak_flops(s.device, cfg.logging)
        logger = MetricsLogger(self.run_dir, s.is_main, cfg.logging.tensorboard, t.progress_bar, t.max_steps,
                               initial_step=self.step)
        try:
            last_step = min(t.max_steps, t.stop_at_step or t.max_steps)
            while self.step < last_step:
                start = time.perf_counter()
                loss = float(s.forward_backward(self._local_micro_batches(self.train_data, self.step), cross_entropy))
                lr = s.current_lr()
                if math.isfinite(loss):
                    grad_norm = s.optimizer_step(t.grad_clip)
                elif t.on_nonfinite == "skip":
                    s.discard_gradients()
                    grad_norm = float("nan")
                else:
                    raise FloatingPointError(f"loss is {loss} at step {self.step + 1}; "
                                             f"trainer.on_nonfinite=skip would skip such steps")
                elapsed = time.perf_counter() - start
                self.step += 1
                logger.advance()
                is_last = self.step == last_step
                do_eval = t.eval_every and (self.step % t.eval_every == 0 or is_last)
                if do_eval or is_last or self.step == 1 or self.step % t.log_every == 0:
                    tokens_per_sec = tokens_per_step / elapsed
                    record = {
                        "step": self.step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                        "tokens_per_sec": tokens_per_sec,
                        "mfu": mfu(flops_per_token, tokens_per_sec, peak, s.world_size),
                        "memory_gb": peak_memory_gb(s.device),
                        **s.memory_breakdown(),
                        **s.step_metrics(),
                    }
                    if do_eval:
                        record["val_loss"] = self.evaluate()
                    logger.log(record)
                if checkpoints.should_save(self.step, is_last) and math.isfinite(loss):
                    checkpoints.save(self.step)
            checkpoints.finish()
        finally:
            logger.close()
