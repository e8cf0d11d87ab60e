"""Fault injection for crash-safety tests, behind one switch: the FRAMEWORK_FAULT environment variable.

FRAMEWORK_FAULT is a comma-separated list of
`<point>:<step>[:rank=<r>][:attempt=<a>][:world=<n>][:micro=<m>][:do=<action>]`.
Points: `startup` (process group up, before the first step; step = the step it resumes from), `step`
(after forward/backward of that step, before the optimizer step), `eval`, `save` (half-way through
writing that step's checkpoint), `between` (after the step's bookkeeping, where the host waits for the
previous step's preemption vote: on a GPU, where it waits for the device), `oom` (after forward/backward
of that step, run with micro-batches of `micro=` sequences: raises torch.OutOfMemoryError, worded as CUDA
words it, whatever `do=` says). `<step>` and `micro=` may be `*`: every step, every micro-batch size.
Without rank=, attempt= or world= it fires on every rank, every restart attempt, every world size (world=
tells a group before an elastic resize from the one after it). Actions: `kill` (SIGKILL itself, the
default), `hang` (sleep until SIGTERM: a stalled rank) or `sleep` with `ms=<n>` (a wait of n ms, then go on:
a device the host waits for).
Unset, `inject` is a dictionary lookup and nothing else.
"""
from __future__ import annotations

import functools
import os
import sys
import signal
import time

FAULTS_ENV = "FRAMEWORK_FAULT"


@functools.cache
def _faults() -> tuple[dict, ...]:
    faults = []
    for item in filter(None, os.environ.get(FAULTS_ENV, "").split(",")):
        point, step, *opts = item.strip().split(":")
        fault = {"point": point, "step": None if step == "*" else int(step), "rank": None, "attempt": None,
                 "world": None, "micro": None, "do": "kill", "ms": 0}
        for opt in opts:
            key, value = opt.split("=")
            fault[key] = value if key == "do" else None if value == "*" else int(value)
        faults.append(fault)
    return tuple(faults)


def inject(point: str, step: int, micro: int | None = None) -> None:
    if FAULTS_ENV not in os.environ:
        return
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for f in _faults():
        if (f["point"] == point and f["step"] in (None, step) and f["rank"] in (None, rank)
                and f["attempt"] in (None, attempt) and f["world"] in (None, world) and f["micro"] in (None, micro)):
            if point == "oom":
                import torch
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {64 * micro:.2f} MiB. GPU {rank} has a total capacity "
                    f"of 79.19 GiB of which {32 * micro:.2f} MiB is free. (injected by FRAMEWORK_FAULT at step {step}, "
                    f"micro-batch {micro})")
            if f["do"] == "sleep":
                time.sleep(f["ms"] / 1000)
                continue
            if f["do"] == "hang":
                # Hung in Python, not in a collective: the agent's SIGTERM (it stops the group) ends it at
                # once instead of after the agent's 30 s grace, and the preemption handler must not
                # wait for a step that never ends.
                signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
                while True:
                    time.sleep(3600)
            print(f"fault injected: rank {rank} kills itself at {point}:{step} (attempt {attempt})",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
