"""The precision plug-in of torch-native strategies: autocast, loss scaling and the scaled step.

fp32 is the identity. Strategies that express precision in their own terms (FSDP2's
MixedPrecisionPolicy, DeepSpeed's bf16/fp16 sections) resolve `precision.*` themselves.
"""
from __future__ import annotations

import contextlib

import torch


class Precision:
    def __init__(self, cfg, device: torch.device):
        self.cfg = cfg
        self.device = device

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer) -> None:
        """Make the gradients true gradients before clipping."""

    def step(self, optimizer) -> bool:
        """Step the optimizer; False when the step was skipped (e.g. inf/nan under loss scaling)."""
        optimizer.step()
        return True

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_precision(cfg, device: torch.device) -> Precision:
    return Precision(cfg, device)
