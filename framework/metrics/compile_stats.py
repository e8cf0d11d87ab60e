"""What torch.compile cost so far in this process: seconds compiling and graphs compiled. A graph count
that still grows after the first steps means recompilation (a guard failed: a new shape or dtype)."""
from __future__ import annotations

import contextlib
import sys


def compile_stats() -> dict[str, float]:
    import torch._dynamo.utils as dynamo_utils
    seconds = dynamo_utils.calculate_time_spent().get("total_wall_time", 0.0)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    return {"compile_time": float(seconds), "compiled_graphs": int(graphs)}


class RecompileWatch:
    """Warns once (rank 0) when graphs are still being compiled after the warm-up steps."""

    def __init__(self, warmup_steps: int = 2):
        self.warmup_steps = warmup_steps
        self.after_warmup: int | None = None
        self.warned = False

    def check(self, step: int, graphs: int, is_main: bool) -> None:
        if step <= self.warmup_steps:
            self.after_warmup = graphs
            return
        if self.after_warmup is not None and graphs > self.after_warmup and not self.warned and is_main:
            print(f"warning: torch.compile recompiled at step {step} ({self.after_warmup} -> {graphs} graphs): a "
                  f"guard failed, usually a new input shape or dtype; TORCH_LOGS=recompiles prints which",
                  file=sys.stderr)
            self.warned = True


class CompileWatch:
    """`trainer.compile`: sets the seconds compiling during a step apart from its step time (as
    compile_time) and warns on recompiles. Off, it does nothing. Only the step is watched, so a graph
    that evaluation compiles stays in eval_time and is not set apart twice."""

    def __init__(self, enabled: bool, is_main: bool):
        self.enabled, self.is_main = enabled, is_main
        self.recompiles = RecompileWatch()
        self.graphs = 0

    @contextlib.contextmanager
    def step(self, step: int, interval):
        if not self.enabled:
            yield
            return
        before = compile_stats()
        yield
        after = compile_stats()
        interval.set_apart("compile_time", after["compile_time"] - before["compile_time"])
        self.graphs = after["compiled_graphs"]
        self.recompiles.check(step, self.graphs, self.is_main)

    def record(self) -> dict[str, int]:
        return {"compiled_graphs": self.graphs} if self.enabled else {}
