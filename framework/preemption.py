"""Preemption: a cluster's warning signal ends the run cleanly at a step boundary.

SLURM sends SIGTERM (or the signal of `--signal`) before a time limit or preemption; Kubernetes
sends SIGTERM before it kills a pod. The handler only notes that the signal came. The trainer asks
`stop_requested()` after every step, which all-reduces the note, so all ranks stop after the same
step even when the signal reached only some of them; the trainer then saves a checkpoint and the
worker exits with exit_codes.REQUEUE.
"""
from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist


class Preempted(Exception):
    """Raised by the trainer after the checkpoint of `step` is on disk."""

    def __init__(self, step: int, signal_name: str, signum: int | None):
        super().__init__(f"stopped after step {step} on {signal_name}")
        self.step = step
        self.signum = signum     # None when the signal reached another rank only


def signal_number(name: str) -> int | None:
    value = getattr(signal, name, None)
    return int(value) if isinstance(value, signal.Signals) else None


class PreemptionWatch:
    """Notes the configured signals while training runs; restores the previous handlers on close."""

    def __init__(self, signal_names, device: torch.device):
        self.device = device
        self.received: str | None = None
        self.signum: int | None = None
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return   # Python delivers signals to the main thread only; whoever runs us there handles them
        for name in signal_names:
            number = signal_number(name)
            self._previous[number] = signal.signal(number, self._note)

    def _note(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        self.signum = signum

    def stop_requested(self) -> bool:
        """True on every rank if any rank received a signal (a collective: call it on all ranks)."""
        if not dist.is_initialized():
            return self.received is not None
        flag = torch.tensor([0 if self.received is None else 1], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.received is None:
            self.received = "a peer's signal"
        return bool(flag.item())

    def close(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}


def pass_on(signum: int | None) -> None:
    """Once the checkpoint is saved and our handlers are gone, a handler that was there before ours gets
    the signal too: under submitit that is its requeue (rank 0 resubmits the job and exits)."""
    if signum is not None and callable(signal.getsignal(signum)):
        signal.raise_signal(signum)
