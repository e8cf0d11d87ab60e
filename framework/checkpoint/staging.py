"""The CPU copy a background save is written from, kept from save to save.

`ReusedStager` stages the state into one set of CPU buffers (pinned when the state is on a GPU)
that every background save reuses. Staging finishes before `dcp.async_save` returns (the
device-to-host copies are waited for), so a save holds exactly the step it was started at while
the next steps run. A save overwrites the buffers, so the previous save must be on disk first
(CheckpointManager waits for it).

It drives torch's `StateDictStager` (the copier inside `DefaultStager`) itself: torch 2.11's
`DefaultStager.stage` closes that copier after every stage, emptying its buffer cache and its
copier table, so the second background save of a run died with `KeyError: <class 'type'>` on the
GPU machine (2.13 no longer closes it). Only `release()` frees the buffers; `close()`, which some
torch versions' `async_save` call after each upload, is a no-op.
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager


class ReusedStager:
    """An `AsyncStager` whose buffers live as long as the strategy, not one save."""

    should_synchronize_after_execute = False

    def __init__(self, device: torch.device):
        self._on_gpu = device.type == "cuda"
        self._stager = StateDictStager(pin_memory=self._on_gpu, share_memory=False)

    def stage(self, state_dict, **kwargs):
        staged = self._stager.stage(state_dict, non_blocking=self._on_gpu)
        if self._on_gpu:           # the non-blocking device-to-host copies land before the step goes on
            torch.accelerator.synchronize()
        return staged

    def synchronize_staging(self) -> None:
        """Staging is already complete when `stage` returns."""

    def close(self) -> None:
        """Called by `dcp.async_save` in some torch versions after each save; the buffers stay."""

    def release(self) -> None:
        """Free the buffers (unpinning them); the stager is not used again."""
        self._stager.close()
