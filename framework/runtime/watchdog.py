"""The stall watchdog: a hang anyone hits leaves evidence of where, and the job fails instead of waiting.

Every rank runs one. If no training step finishes within `trainer.stall_timeout_s`, the rank writes
the Python stack of each of its threads to `<run dir>/stall/rank_N.txt` and exits with exit_codes.STALL.
The healthy ranks of a stalled job are blocked in a collective waiting for the stalled one, so their
watchdogs fire within one poll interval of each other; each waits a short grace before exiting, so
that every rank has written its stacks before the first exit makes the others' collectives fail.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

from framework import exit_codes

STALL_DIR = "stall"


class StallWatchdog:
    def __init__(self, run_dir: str, rank: int, timeout_s: float):
        self.path = os.path.join(run_dir, STALL_DIR, f"rank_{rank}.txt")
        self.timeout_s = timeout_s
        self.poll_s = min(1.0, timeout_s / 10)
        self.step = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)

    def start(self) -> "StallWatchdog":
        if self.timeout_s > 0:
            self._last = time.monotonic()
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self, step: int) -> None:
        """A step finished."""
        self.step = step
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            f.write(f"stall: no step finished for {idle:.1f} s (trainer.stall_timeout_s={self.timeout_s:g}); "
                    f"last finished step: {self.step}; pid {os.getpid()}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        print(f"error: stalled: no step finished for {idle:.0f} s after step {self.step} "
              f"(trainer.stall_timeout_s={self.timeout_s:g}); stacks in {self.path}", file=sys.stderr, flush=True)
        time.sleep(2 * self.poll_s + 1.0)
        os._exit(exit_codes.STALL)
