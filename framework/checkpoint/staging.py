"""The CPU copy a background save is written from, kept from save to save.

`ReusedStager` stages the state into one set of CPU buffers (pinned when the state is on a GPU)
that every background save reuses. Staging finishes before `dcp.async_save` returns (the
device-to-host copies are waited for), so a save holds exactly the step it was started at while
the next steps run. A save overwrites the buffers, so the previous save must be on disk first
(CheckpointManager waits for it).

Only `release()` frees the buffers. `close()` is a no-op on purpose: torch 2.11's `async_save`
closes the stager it is given once a save's upload is done (2.13 closes only a stager it made
itself), and a closed `DefaultStager` has an empty copier table, so the next save died with
`KeyError: <class 'type'>` on the GPU.
"""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


class ReusedStager:
    """An `AsyncStager` over one `DefaultStager` whose lifetime is the strategy's, not one save's."""

    should_synchronize_after_execute = False

    def __init__(self, device: torch.device):
        on_gpu = device.type == "cuda"
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False,
                                                    use_async_staging=False, use_non_blocking_copy=on_gpu))

    def stage(self, state_dict, **kwargs):
        return self._stager.stage(state_dict, **kwargs)

    def synchronize_staging(self) -> None:
        self._stager.synchronize_staging()

    def close(self) -> None:
        """Called by `dcp.async_save` in some torch versions after each save; the buffers stay."""

    def release(self) -> None:
        """Free the buffers (unpinning them); the stager is not used again."""
        self._stager.close()
