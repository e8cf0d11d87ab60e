"""How one global batch splits over a job's ranks: the batch rule, computed and checked in one place.

trainer.global_batch_size sequences make one optimizer step. Each of the dp data-parallel ranks takes
its share, global / dp, and runs it as forwards of trainer.micro_batch_size sequences (unset: the whole
share in one forward), so gradient accumulation is share / micro; both must divide evenly. With a
pipeline (pp > 1) the share is cut instead into parallel.pp_microbatches pipeline micro-batches (unset:
share / micro, at least what the schedule needs), and micro_batch_size only sets that default.

`batch_layout(cfg, dp, pp)` is the one function that computes it; validation calls it in the launching
process (through Strategy.batch_layout, which knows the degrees), and strategies, the planner and the
DeepSpeed JSON read the same numbers from it. A rule it breaks is one ConfigError naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from framework.errors import ConfigError
from framework.parallel.pipeline import min_microbatches


@dataclass(frozen=True)
class BatchLayout:
    global_batch: int            # sequences per optimizer step (trainer.global_batch_size)
    dp: int                      # data-parallel degree: ranks that each take their own share
    micro_batch: int             # trainer.micro_batch_size, filled in: sequences the trainer hands over at once
    pp: int = 1                  # pipeline degree (1: no pipeline)
    pipeline_microbatches: int = 1   # pipeline micro-batches per step on one rank (1 without a pipeline)

    @property
    def per_rank(self) -> int:
        """A data-parallel rank's share of each global batch."""
        return self.global_batch // self.dp

    @property
    def forward_batch(self) -> int:
        """Sequences in one forward pass on one rank (with a pipeline: one pipeline micro-batch)."""
        return self.per_rank // self.pipeline_microbatches if self.pp > 1 else self.micro_batch

    @property
    def accumulation(self) -> int:
        """Forward passes per optimizer step on one rank (with a pipeline: its micro-batches)."""
        return self.per_rank // self.forward_batch

    def with_global(self, global_batch: int) -> "BatchLayout":
        """The same forward passes over another global batch (a step of a batch-size ramp): more or fewer
        of them. The caller makes sure that a rank's share divides into them (config/batch_changes.py)."""
        if self.pp > 1:
            return replace(self, global_batch=global_batch,
                           pipeline_microbatches=global_batch // self.dp // self.forward_batch)
        return replace(self, global_batch=global_batch)

    def halved(self) -> "BatchLayout | None":
        """Forward passes of at most half as many sequences (the largest divisor of the forward batch that
        is, so that every share the forward batch divides, it divides too), or None at one sequence."""
        smaller = next((n for n in range(self.forward_batch // 2, 0, -1) if self.forward_batch % n == 0), None)
        if smaller is None:
            return None
        if self.pp > 1:
            return replace(self, micro_batch=smaller, pipeline_microbatches=self.per_rank // smaller)
        return replace(self, micro_batch=smaller)


def batch_layout(cfg, dp: int, pp: int = 1) -> BatchLayout:
    """The layout of cfg.trainer's batch over dp data-parallel ranks (and pp pipeline stages), or ConfigError."""
    t = cfg.trainer
    total, micro = t.global_batch_size, t.micro_batch_size
    if total is None or total <= 0:
        raise ConfigError("trainer.global_batch_size", f"must be positive, got {total}")
    if micro is not None and micro <= 0:
        raise ConfigError("trainer.micro_batch_size", f"must be positive, got {micro}")
    if total % dp:
        raise ConfigError("trainer.global_batch_size", f"{total} sequences do not divide among {dp} data-parallel "
                                                       f"ranks; use a multiple of {dp}")
    share = total // dp
    micro = share if micro is None else micro
    if pp > 1:
        return BatchLayout(total, dp, micro, pp, _pipeline_microbatches(cfg, share, micro, dp, pp))
    if micro > share:
        raise ConfigError("trainer.micro_batch_size", f"{micro} exceeds a data-parallel rank's share of {share} "
                                                      f"sequences ({total} / dp {dp}); use at most {share}")
    if share % micro:
        raise ConfigError("trainer.global_batch_size", f"{total} is not divisible by micro_batch_size x "
                                                       f"data-parallel degree = {micro} x {dp} = {micro * dp}")
    return BatchLayout(total, dp, micro)


def micro_batch_for(total: int, dp: int, accumulation: int) -> int | None:
    """The micro_batch_size that makes `accumulation` forwards per step out of `total` sequences on dp
    ranks, or None where none does."""
    per_micro = accumulation * dp
    return total // per_micro if accumulation > 0 and total % per_micro == 0 else None


def _pipeline_microbatches(cfg, share: int, micro: int, dp: int, pp: int) -> int:
    p = cfg.parallel
    n = p.pp_microbatches
    if n is None:
        n = max(share // micro, min_microbatches(p.pp_schedule, pp, p.pp_virtual_stages))
    elif n <= 0:
        raise ConfigError("parallel.pp_microbatches", f"must be positive, got {n}")
    if share % n:
        raise ConfigError("parallel.pp_microbatches", f"a data-parallel rank's {share} sequences "
                                                      f"({share * dp} / dp {dp}) do not split into {n} equal "
                                                      f"pipeline micro-batches")
    return n
