"""eval.tasks: benchmark scores of the live model every eval.every steps (and at the last), under whatever layout
the job runs, into the step's metrics record as eval/<task>/<metric>.

Every rank runs lm-eval itself on the same requests (they follow deterministically from the tasks' files), and
each batch of requests is one forward of the training shape through the strategy (evaluation/scoring.py), so
every rank takes part in each. lm-eval hands its results to global rank 0 only; they go from there to every rank,
where checkpoint.keep_best may rank by them. No random state moves, so the training that follows is the one a job
without the scores trains."""
from __future__ import annotations

import contextlib
import io
import logging

import torch.distributed as dist
from omegaconf import OmegaConf

from framework.data.tokenizer import chat_config_of_data, of_data
from framework.evaluation.rules import every_of
from framework.evaluation.scoring import strategy_scorer
from framework.evaluation.tasks import go_offline


class TaskScores:
    def __init__(self, cfg, strategy, batches):
        self.cfg, self.strategy, self.batches = cfg, strategy, batches
        self.tasks, self.include_path = list(cfg.eval.tasks), list(cfg.eval.include_path)
        self.every = every_of(cfg) if self.tasks else 0
        self._lm = None
        if self.tasks:      # the launcher checked them; in a worker the variables go in before lm_eval's import
            go_offline(self.tasks, self.include_path)
            if not strategy.is_main:
                logging.getLogger("lm_eval").setLevel(logging.WARNING)

    def _model(self):
        if self._lm is None:
            from framework.evaluation.harness import FrameworkLM, prefix_for
            cfg, tok = self.cfg, of_data(self.cfg.data)
            self.batches.plan(self.batches.layout)
            vocab = OmegaConf.select(cfg, "model.vocab_size", default=None) or cfg.data.vocab_size
            chat = chat_config_of_data(cfg.data) if cfg.eval.apply_chat_template else None
            self._lm = FrameworkLM(strategy_scorer(self.strategy, self.batches.layout.micro_batch), tok,
                                   cfg.data.seq_len, prefix_for(tok, vocab), cfg.trainer.global_batch_size,
                                   width=cfg.data.seq_len, chat=chat)
        return self._lm

    def run(self) -> dict[str, float]:
        from lm_eval.tasks import TaskManager

        from framework.evaluation import scores
        from framework.evaluation.tasks import SHIPPED
        local = go_offline(self.tasks, self.include_path)
        # lm-eval's progress bars and notes once, from rank 0 (the other ranks run the same requests)
        quiet = contextlib.nullcontext() if self.strategy.is_main else contextlib.redirect_stderr(io.StringIO())
        with quiet:
            manager = TaskManager(include_path=[SHIPPED, *self.include_path], include_defaults=not local)
            results = scores.evaluate(self._model(), self.tasks, manager, self.cfg.eval.limit,
                                      self.cfg.eval.apply_chat_template, bootstrap_iters=0)
        found = [None if results is None else scores.record(results)]
        if dist.is_initialized():
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def add_to(self, record: dict, interval, due: bool) -> None:
        """The scores into the record of a step plan_step says they are due at, their time apart as tasks_time."""
        if due:
            with interval.timed_apart("tasks_time"):
                record.update(self.run())
