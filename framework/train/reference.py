"""Where a preference objective's reference log-probs come from (objective.needs_reference): with LoRA, the
policy with its adapters switched off (no second copy of any weight: framework/models/lora.py adapters_off);
without, a frozen copy of the initial model that the strategy builds and lays out as it lays out the policy
(Strategy.build_reference). Before each step's (or evaluation's) micro-batches run, one pass without gradient
over the same micro-batches queues the reference's log-probs, which the objective's loss then takes in order.

With objective.precompute_reference=true no reference is held through training: one pass before the first step
scores every pair (framework/train/reference_table.py), and each step's log-probs are looked up by pair id."""
from __future__ import annotations

import time

import torch

from framework import storage
from framework.models.lora import adapters_off
from framework.objectives.registry import precomputed_reference
from framework.train import reference_table


class ReferencePass:
    def __init__(self, cfg, strategy, objective, model_factory=None):
        self.strategy, self.objective = strategy, objective
        self.active = objective.needs_reference
        self.lora = cfg.lora.enabled
        self.precomputed = self.active and precomputed_reference(cfg)
        #: objective.precompute_reference: {sampler: its pairs' [pairs, 2] log-probs by pair id}
        self.tables: dict = {}
        if self.active and not self.lora and not self.precomputed:
            strategy.build_reference(model_factory)

    def model(self):
        """Within: the strategy's model is the reference (without a frozen copy: the policy as it is)."""
        return adapters_off() if self.lora else self.strategy.reference()

    def precompute(self, batches, checkpoints, resume_from: str | None, **samplers) -> None:
        """objective.precompute_reference: the tables of `samplers` (split=sampler or None) read back from the
        checkpoint `resume_from` where it holds them, else scored now, while the policy still has its initial
        weights (before any checkpoint is loaded); from here on every checkpoint keeps them."""
        if not self.precomputed:
            return
        samplers = {split: sampler for split, sampler in samplers.items() if sampler is not None}
        s, started = self.strategy, time.perf_counter()
        expected = {split: (sampler.num_sequences, reference_table.data_fingerprint(sampler.layout))
                    for split, sampler in samplers.items()}
        where = storage.join(resume_from, reference_table.TABLE) if resume_from else None
        tables, said = {}, []
        if where is not None and storage.isfile(where):
            tables = reference_table.decode(storage.read_bytes(where), where, expected)
            said.append(f"read the reference log-probs of {self._counted(tables)} from {where}")
        scored = [split for split in samplers if split not in tables]
        if scored:
            batches.plan(batches.layout)
            with self.model():
                tables.update({split: reference_table.score(s, batches.layout, samplers[split], self.objective,
                                                            batches.width)
                               for split in scored})
            said.append(f"scored {self._counted({split: tables[split] for split in scored})} with the reference model")
        self.tables = {samplers[split]: table for split, table in tables.items()}
        checkpoints.keep_with_each(reference_table.TABLE, reference_table.encode(
            tables, {split: fingerprint for split, (_, fingerprint) in expected.items()}))
        if s.is_main:
            print(f"objective.precompute_reference: {'; '.join(said)} in {time.perf_counter() - started:.1f}s",
                  flush=True)

    @staticmethod
    def _counted(tables: dict) -> str:
        return " and ".join(f"{len(table)} {split} pairs" for split, table in tables.items())

    def run(self, micro_batches, sampler=None, ids=None) -> None:
        """Queue the reference's log-probs of these micro-batches (what the last call queued is forgotten);
        `ids`: their pairs' ids in `sampler`'s data, in order (the precomputed table's keys)."""
        if not self.active:
            return
        self.objective.forget_reference()
        if not self.precomputed:
            with self.model():
                self.strategy.eval_loss(micro_batches, self.objective.reference_fn)
            return
        table = self.tables.get(sampler)
        if table is None or ids is None:
            return      # micro-batches no loss of the objective's reads (samples' picks)
        ids, first = torch.as_tensor(ids, dtype=torch.long), 0
        for batch in micro_batches:
            pairs = len(batch[1]) // self.objective.rows_per_example
            self.objective.reference.append(table[ids[first:first + pairs]].to(self.strategy.device))
            first += pairs
