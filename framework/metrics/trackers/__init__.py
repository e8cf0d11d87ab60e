"""Experiment trackers, chosen by logging.trackers (any of TRACKERS; metrics.jsonl is always written).

`probe` runs in the launching process before any work: a tracker that cannot be reached stops the job
(exit 2), or with logging.tracker_errors=warn is dropped with a warning. In the workers rank 0 starts the
chosen ones (continuing the runs the run dir records) and `Trackers` feeds them from one background thread:
a slow server never holds a step, and a tracker that fails mid-run is dropped with one warning while
training goes on and metrics.jsonl keeps every record.

A server that stops answering holds the job for at most logging.tracker_timeout_s at each place it could: the
probe (each tracker's own request timeout), a tracker's start (waited for that long, then given up: it did not
start), and the end of the run (what is still queued gets that long to drain).
"""
from __future__ import annotations

import importlib
import os
import queue
import sys
import threading

from framework.metrics.trackers import run_ids
from framework.metrics.trackers.base import Tracker, TrackerError, split_record
from framework.redact import redacted

#: name -> "module:class" (imported when chosen: each needs its own client library)
TRACKERS = {
    "tensorboard": "framework.metrics.trackers.tensorboard_tracker:TensorBoardTracker",
    "mlflow": "framework.metrics.trackers.mlflow_tracker:MlflowTracker",
    "wandb": "framework.metrics.trackers.wandb_tracker:WandbTracker",
}


def register(name: str, path: str) -> None:
    """Another tracker under `name` (a plugin or a test): `path` is "module:class"."""
    TRACKERS[name] = path


def tracker_class(name: str) -> type[Tracker]:
    module, _, cls = TRACKERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def default_run_name(run_dir: str) -> str:
    """The run dir's name; a sweep point's (hydra's subdir, a number) with its sweep dir's name before it."""
    path = os.path.normpath(os.path.abspath(run_dir))
    name = os.path.basename(path)
    return f"{os.path.basename(os.path.dirname(path))}-{name}" if name.isdigit() else name


def probe(cfg) -> None:
    """TrackerError for the first chosen tracker that cannot be reached; with logging.tracker_errors=warn,
    a warning instead, and the tracker is dropped from logging.trackers (the workers then skip it)."""
    kept = []
    for name in cfg.logging.trackers:
        try:
            tracker_class(name).probe(cfg)
            kept.append(name)
        except TrackerError as e:
            if cfg.logging.tracker_errors != "warn":
                raise
            print(f"warning: logging.trackers: {redacted(str(e))}; going on without it (logging.tracker_errors=warn)",
                  file=sys.stderr)
    cfg.logging.trackers = kept


class Trackers:
    """The chosen trackers of rank 0, fed in order from one background thread."""

    def __init__(self, cfg, run_dir: str):
        self.live: list[Tracker] = []
        self.timeout_s = cfg.logging.tracker_timeout_s
        ids = run_ids.recorded(run_dir)
        for name in cfg.logging.trackers:
            tracker = tracker_class(name)()
            try:
                if tracker.package:     # its client library first: seconds of imports are not the server's answer
                    importlib.import_module(tracker.package)
                run_id = _within(self.timeout_s, tracker.start, cfg, run_dir, ids.get(name))
            except Exception as e:
                if cfg.logging.tracker_errors != "warn":
                    raise TrackerError(f"logging.trackers: {name} did not start ({type(e).__name__}: {e})") from e
                self._warn(name, "did not start", e)
                continue
            if run_id is not None:
                ids[name] = run_id
            self.live.append(tracker)
        if ids:
            run_ids.record(run_dir, ids)
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
        if self.live:
            self._thread.start()

    @staticmethod
    def _warn(name: str, what: str, e: BaseException) -> None:
        print(f"warning: logging.trackers: {name} {what} ({type(e).__name__}: {redacted(str(e))[:300]}); training "
              f"goes on without it, metrics.jsonl keeps every record", file=sys.stderr, flush=True)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            method, args = item
            for tracker in list(self.live):
                try:
                    getattr(tracker, method)(*args)
                except Exception as e:
                    self.live.remove(tracker)
                    self._warn(tracker.name, f"failed ({method})", e)

    def log(self, record: dict) -> None:
        if self.live:
            self._queue.put(("log", split_record(record)))

    def log_summary(self, summary: dict) -> None:
        if self.live:
            self._queue.put(("log_summary", (summary,)))

    def close(self, finished: bool) -> None:
        if not self.live:
            return
        self._queue.put(("close", (finished,)))
        self._queue.put(None)
        self._thread.join(self.timeout_s)
        if self._thread.is_alive():
            print(f"warning: logging.trackers: {', '.join(t.name for t in self.live)} still busy after "
                  f"logging.tracker_timeout_s={self.timeout_s:g} s; the last records may be missing there "
                  f"(metrics.jsonl has them)", file=sys.stderr, flush=True)


def _within(seconds: float, call, *args):
    """call(*args), waited for at most `seconds` (TimeoutError after that): in a thread of its own, left to end by
    itself in the background if it does (a daemon: it never holds the process's exit)."""
    done: dict = {}

    def run() -> None:
        try:
            done["value"] = call(*args)
        except BaseException as e:      # handed to the caller, whatever it is
            done["error"] = e
    thread = threading.Thread(target=run, name="tracker-start", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within logging.tracker_timeout_s={seconds:g} s")
    if "error" in done:
        raise done["error"]
    return done["value"]
