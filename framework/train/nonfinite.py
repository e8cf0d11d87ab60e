"""trainer.on_nonfinite: a step whose loss is NaN/inf. `skip` must know before the update, so reads the loss every
step and discards such a step's gradients; `abort` does not wait for the device every step: the first step whose
loss was NaN/inf is kept on the loss's device and read only when the trainer reads the loss anyway (a logged
step) or must not go on without knowing (before a checkpoint is written)."""
from __future__ import annotations

import math

import torch


class NonFiniteLoss:
    def __init__(self, on_nonfinite: str = "abort"):
        self.skips = on_nonfinite == "skip"
        self._first_step = None     # 0-d tensors, set on the first note()
        self._value = None

    def update(self, strategy, loss: torch.Tensor, step: int, grad_clip: float) -> tuple[bool, torch.Tensor]:
        """The step's optimizer update, or under `skip` its gradients discarded where the loss is not finite:
        (whether it was, the gradient norm: NaN for a skipped step)."""
        if self.skips and not math.isfinite(float(loss)):
            strategy.discard_gradients()
            return False, torch.tensor(float("nan"))
        self.note(loss, step)
        return True, strategy.optimizer_step(grad_clip)

    def note(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.detach().float()
        if self._first_step is None:
            self._first_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._value = torch.zeros((), device=loss.device)
        first = (self._first_step < 0) & ~torch.isfinite(loss)
        self._first_step = torch.where(first, torch.full_like(self._first_step, step), self._first_step)
        self._value = torch.where(first, loss, self._value)

    def check(self) -> None:
        """Raise if any noted loss was not finite (waits for the device)."""
        if self._first_step is not None and int(self._first_step) >= 0:
            raise FloatingPointError(f"loss is {float(self._value)} at step {int(self._first_step)}; "
                                     f"trainer.on_nonfinite=skip would skip such steps")
