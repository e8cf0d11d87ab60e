"""What torch.compile cost so far in this process: seconds compiling and graphs compiled. A graph count
that still grows after the first steps means recompilation (a guard failed: a new shape or dtype)."""
from __future__ import annotations

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
