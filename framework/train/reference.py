"""Where a preference objective's reference log-probs come from (objective.needs_reference): with LoRA, the
policy with its adapters switched off (no second copy of any weight: framework/models/lora.py adapters_off);
without, a frozen copy of the initial model that the strategy builds and lays out as it lays out the policy
(Strategy.build_reference). Before each step's (or evaluation's) micro-batches run, one pass without gradient
over the same micro-batches queues the reference's log-probs, which the objective's loss then takes in order."""
from __future__ import annotations

from framework.models.lora import adapters_off


class ReferencePass:
    def __init__(self, cfg, strategy, objective, model_factory=None):
        self.strategy, self.objective = strategy, objective
        self.active = objective.needs_reference
        self.lora = cfg.lora.enabled
        if self.active and not self.lora:
            strategy.build_reference(model_factory)

    def model(self):
        """Within: the strategy's model is the reference."""
        return adapters_off() if self.lora else self.strategy.reference()

    def run(self, micro_batches) -> None:
        """Queue the reference's log-probs of these micro-batches (what the last call queued is forgotten)."""
        if not self.active:
            return
        self.objective.forget_reference()
        with self.model():
            self.strategy.eval_loss(micro_batches, self.objective.reference_fn)
