"""Preemption: a cluster's warning signal ends the run cleanly at a step boundary.

SLURM sends SIGTERM (or the signal of `--signal`) before a time limit or preemption; Kubernetes
sends SIGTERM before it kills a pod. The handler only notes that the signal came. The trainer asks
`stop_requested()` after every step, which all-reduces the note, so all ranks stop after the same
step even when the signal reached only some of them; the trainer then saves a checkpoint and the
worker exits with exit_codes.REQUEUE. The vote is all-reduced in the background and read one step
later, so that no step waits for the device (on a GPU, reading it at once would stall the host every
step); every rank reads the same vote after the same step, so they still stop together.

The launcher's side (framework.launch.admission): its fork server ignores these signals (`ignoring`), so a signal to
the whole process group reaches the workers and not their parent; the launcher passes the first one on to
the workers and ignores repeats while they save (`stopping_once_on`).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

import torch
import torch.distributed as dist


#: a file a wrapping launcher (framework.torchrun) names: workers that stopped with their checkpoint saved say so there
REQUEUE_REPORT = "FRAMEWORK_REQUEUE_REPORT"


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
        self._vote = None        # (work, flag) of the all-reduce started after the previous step
        if threading.current_thread() is not threading.main_thread():
            return   # Python delivers signals to the main thread only; whoever runs us there handles them
        for name in signal_names:
            number = signal_number(name)
            self._previous[number] = signal.signal(number, self._note)

    def _note(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        self.signum = signum

    def stop_if_requested(self, step: int, save) -> None:
        """Every rank, between steps: where any rank received a preemption signal, `save()` (the step's
        checkpoint where it has none yet) and raise Preempted."""
        if self.stop_requested():
            save()
            raise Preempted(step, self.received, self.signum)

    def stop_requested(self) -> bool:
        """True on every rank once any rank received a signal (a collective: all ranks call it after
        every step). Reads the vote started after the previous step, then starts this step's."""
        if not dist.is_initialized():
            return self.received is not None
        stop = False
        if self._vote is not None:
            work, flag = self._vote
            work.wait()
            stop = bool(flag.item())
        if stop:
            self._vote = None
            if self.received is None:
                self.received = "a peer's signal"
            return True
        flag = torch.tensor([0 if self.received is None else 1], device=self.device)
        self._vote = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return False

    def finish(self) -> None:
        """At the end of a run every rank waits for the last vote it started (never on a failure: a
        dead peer would never answer it)."""
        if self._vote is not None:
            self._vote[0].wait()
            self._vote = None

    def close(self) -> None:
        """Restores the previous handlers; once a signal came, a default action becomes SIG_IGN: a repeat
        (SLURM signals every process, and the launcher passes it on too) must not kill a rank that is
        finishing its exit after the save."""
        for number, handler in self._previous.items():
            keep_out = self.received is not None and handler in (signal.SIG_DFL, None)
            signal.signal(number, signal.SIG_IGN if keep_out else handler)
        self._previous = {}


def report_requeue(rank: int) -> None:
    """Tell the launcher that wraps this worker's (framework.torchrun) that it stopped with a checkpoint saved."""
    path = os.environ.get(REQUEUE_REPORT)
    if path:
        with open(path, "a") as f:
            f.write(f"{rank}\n")


def pass_on(signum: int | None) -> None:
    """Once the checkpoint is saved and our handlers are gone, a handler that was there before ours gets
    the signal too: under submitit that is its requeue (rank 0 resubmits the job and exits)."""
    if signum is not None and callable(signal.getsignal(signum)):
        signal.raise_signal(signum)


@contextmanager
def ignoring(signal_names):
    """SIG_IGN for these signals meanwhile: a process started now inherits it across exec."""
    previous = {n: signal.signal(n, signal.SIG_IGN) for n in map(signal_number, signal_names) if n is not None}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def stopping_once_on(signal_names):
    """The launcher's handler of the preemption signals: the first one raises torch's SignalException,
    on which the elastic agent passes it on to the workers and waits for them to save and exit; repeats
    are ignored (torch's own handler raised again inside that wait, and the launcher left its workers
    mid-save)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    numbers = [n for n in map(signal_number, signal_names) if n is not None]
    came = []

    def stop(signum, frame):
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)
        came.append(signum)
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    previous = {n: signal.signal(n, stop) for n in numbers}
    try:
        yield
    finally:
        if not came:    # after a signal they stay ignored: the launcher is on its way out
            for number, handler in previous.items():
                signal.signal(number, handler)
