"""The rules of the options that change a step's batch mid-run: trainer.rampup_batch_size (global batches
that grow, framework/data/ramp.py) and trainer.on_oom=retry (micro-batches halved after an out-of-memory
error, framework/train/step_batches.py). Every layout a run may reach must be one the strategy serves: each is
validated as if it were the configured one, and a refusal names both keys."""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from framework.data.ramp import BatchSizes
from framework.errors import ConfigError

if TYPE_CHECKING:
    from framework.config.schema import Config

RAMP = "trainer.rampup_batch_size"


def _ramp(cfg: Config) -> list[int] | None:
    ramp = cfg.trainer.rampup_batch_size
    if ramp is None:
        return None
    ramp = list(ramp)
    final = cfg.trainer.global_batch_size
    if len(ramp) != 3 or any(not isinstance(v, int) or v <= 0 for v in ramp):
        raise ConfigError(RAMP, f"give [start, increment, samples], three positive integers, got {ramp}")
    start, increment, _ = ramp
    if start >= final:
        raise ConfigError(RAMP, f"starts at {start} sequences, not below trainer.global_batch_size={final}")
    if (final - start) % increment:
        raise ConfigError(RAMP, f"steps of {increment} from {start} do not reach trainer.global_batch_size={final}; "
                                f"use an increment that divides {final - start}")
    return ramp


def _serves(cfg: Config, strategy_cls, world_size: int, key: str, why: str, global_batch: int, micro: int,
            pipeline_microbatches: int | None) -> None:
    """Validate the strategy as if the run were configured with this batch; a refusal names `key` too."""
    trial = copy.deepcopy(cfg)
    OmegaConf.set_readonly(trial, False)     # a trial copy, not the job's config (which is read-only by now)
    OmegaConf.update(trial, "trainer.global_batch_size", global_batch)
    OmegaConf.update(trial, "trainer.micro_batch_size", micro)
    if pipeline_microbatches is not None:
        OmegaConf.update(trial, "parallel.pp_microbatches", pipeline_microbatches)
    try:
        strategy_cls.batch_layout(trial, world_size)
        strategy_cls.validate(trial, world_size)
    except ConfigError as e:
        raise ConfigError(key, f"{why}, where {e}") from None


def validate_batch_changes(cfg: Config, strategy_cls, world_size: int) -> None:
    t = cfg.trainer
    ramp = _ramp(cfg)
    for key, on in ((RAMP, ramp is not None), ("trainer.on_oom", t.on_oom == "retry")):
        if on and strategy_cls.batch_change_note:
            raise ConfigError(key, f"parallel={strategy_cls.name} cannot change a step's micro-batches mid-run: "
                                   f"{strategy_cls.batch_change_note}; set {key}={'null' if key == RAMP else 'abort'}")
    final = strategy_cls.batch_layout(cfg, world_size)
    pipelined = final.pp > 1
    if ramp is not None:
        for size in BatchSizes(final.global_batch, ramp).distinct()[:-1]:
            if size % (final.dp * final.forward_batch):
                raise ConfigError(RAMP, f"a ramp step of {size} sequences does not split into forward passes of "
                                        f"{final.forward_batch} on {final.dp} data-parallel ranks; make start and "
                                        f"increment multiples of {final.dp * final.forward_batch}, or lower "
                                        f"trainer.micro_batch_size")
            _serves(cfg, strategy_cls, world_size, RAMP, f"a ramp step takes {size} sequences", size,
                    final.micro_batch, size // final.dp // final.forward_batch if pipelined else None)
    if t.on_oom == "retry":
        smaller = final.halved()
        while smaller is not None:
            _serves(cfg, strategy_cls, world_size, "trainer.on_oom",
                    f"retry may halve the micro-batch to {smaller.forward_batch}", final.global_batch,
                    smaller.micro_batch, smaller.pipeline_microbatches if pipelined else None)
            smaller = smaller.halved()
