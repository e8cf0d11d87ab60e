"""`trainer.profile.steps=[a,b]`: a torch.profiler trace of steps a..b on every rank.

Written to `<run dir>/profile/rank_<r>.pt.trace.json` (Chrome trace format: Perfetto opens it, and
TensorBoard's profiler plugin reads `*.pt.trace.json` from that folder), with CPU activity and, on CUDA,
kernels and memory. `trainer.profile.memory_snapshot=true` on CUDA also records the allocator history
over those steps into `rank_<r>.memory.pickle` (pytorch.org/memory_viz). Off (no steps) it is a no-op.
Each step is a `ProfilerStep#<step>` span (the name TensorBoard's plugin reads) from the start of that
step to the start of the next, so the spans cover the whole loop, the host's waits between steps too;
the trace is written when the step after the last begins (or when the run ends).
"""
from __future__ import annotations

import os

import torch

PROFILE_DIR = "profile"


class StepProfiler:
    def __init__(self, profile_cfg, run_dir: str, rank: int, device: torch.device):
        steps = list(profile_cfg.steps or [])
        self.first, self.last = (steps[0], steps[-1]) if steps else (None, None)
        self.memory = bool(profile_cfg.memory_snapshot) and device.type == "cuda"
        self.out = os.path.join(run_dir, PROFILE_DIR)
        self.rank, self.device = rank, device
        self._prof = None

    def before_step(self, step: int) -> None:
        """`step` is the 1-based number of the step about to run."""
        if self._prof is not None:
            self._step_span.__exit__(None, None, None)
            if step > self.last:
                self._stop()
                return
        elif step == self.first:
            self._start()
        if self._prof is not None:
            self._step_span = torch.profiler.record_function(f"ProfilerStep#{step}")
            self._step_span.__enter__()

    def _start(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=True,
                                            profile_memory=True, with_stack=False)
        self._prof.__enter__()

    def _stop(self) -> None:
        self._prof.__exit__(None, None, None)
        self._prof.export_chrome_trace(os.path.join(self.out, f"rank_{self.rank}.pt.trace.json"))
        self._prof = None
        if self.memory:
            torch.cuda.memory._dump_snapshot(os.path.join(self.out, f"rank_{self.rank}.memory.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)

    def close(self) -> None:
        if self._prof is not None:            # the run ended inside the window or right after its last step
            self._step_span.__exit__(None, None, None)
            self._stop()
