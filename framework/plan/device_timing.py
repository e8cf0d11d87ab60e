"""On the GPU it plans for, `python -m framework.plan` times the job's own model instead of modelling its
operators (plan/gpu_time.py): one micro-batch's forward, loss and backward, and one clipped optimizer step.

The model is built shortened to two and to three periods of blocks (plan/few_blocks.py), in the dtype the
job's wrapper computes in (`Layout.casting`: bf16 weights under FSDP2's policy and DeepSpeed's engine, fp32
weights under autocast otherwise), float8's linears converted and blocks compiled as the job does them, and
its activation checkpointing. Each further period costs what the third one added; the embedding, head and
loss cost what the two-period model takes beyond its two periods. Each is the median of REPEATS runs after
WARMUPS (compilation, the allocator's first requests), the device synchronised around each.

What is timed is one rank's own work on a whole model: the planner divides it by tp, cp and pp as it
divides the modelled time, and adds communication from its own model. Where the wrapper computes in bf16
weights the optimizer step is modelled instead (the timed model would step bf16 weights; the job steps its
fp32 shards). A model that does not fit the device
even so shortened, or cannot run there, is modelled instead; the plan says which it used.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.optim.factory import OptimizerFactory
from framework.plan import few_blocks
from framework.plan.cache_key import config_key
from framework.plan.layout import Casting

if TYPE_CHECKING:
    from framework.config.schema import Config

log = logging.getLogger(__name__)

WARMUPS = 2
REPEATS = 5


@dataclass(frozen=True)
class DeviceTiming:
    block_s: float          # one micro-batch through every block, forward and backward
    rest_s: float           # the embedding, head and loss of that micro-batch
    optimizer_s: float      # one clipped step of the whole (unsharded) model's optimizer, zero_grad included


def median(times: list[float]) -> float:
    return sorted(times)[len(times) // 2]


def time_steps(model: torch.nn.Module, optimizer, tokens: torch.Tensor, repeats: int,
               autocast=contextlib.nullcontext, sync=lambda: None) -> tuple[float, float]:
    """Medians of (forward + loss + backward, clipping + optimizer step + zero_grad) over `repeats` runs
    after WARMUPS, `sync()` waiting for the device before each clock reading."""
    micro, step = [], []
    for _ in range(WARMUPS + repeats):
        sync()
        start = time.perf_counter()
        with autocast():
            loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        sync()
        middle = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        micro.append(middle - start)
        step.append(time.perf_counter() - middle)
    return median(micro[WARMUPS:]), median(step[WARMUPS:])


_CACHE: dict = {}


def timed_on_device(cfg: Config, micro_batch: int, seq_len: int, casting: Casting, device: str) -> DeviceTiming | None:
    """The job's model timed on `device` ("cuda", or "cpu" for the tests), extended from two and three
    periods of blocks to all of them; None where it cannot run there (the reason is logged)."""
    key = (config_key(cfg.model), config_key(cfg.activation_checkpointing), config_key(cfg.optimizer),
           config_key(cfg.precision), bool(cfg.trainer.get("compile")), int(cfg.data.vocab_size), micro_batch,
           seq_len, casting, device)
    if key not in _CACHE:
        _CACHE[key] = _timed(cfg, micro_batch, seq_len, casting, device)
    return _CACHE[key]


def _timed(cfg: Config, micro_batch: int, seq_len: int, casting: Casting, device: str) -> DeviceTiming | None:
    two, three = few_blocks.shortened(cfg, 2), few_blocks.shortened(cfg, 3)
    try:
        if two is None or three is None:        # a model that cannot be shortened is timed whole
            whole, optimizer = _seconds(cfg, micro_batch, seq_len, casting, device)
            return DeviceTiming(block_s=whole, rest_s=0.0, optimizer_s=optimizer)
        two_s, two_opt = _seconds(two, micro_batch, seq_len, casting, device)
        three_s, three_opt = _seconds(three, micro_batch, seq_len, casting, device)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        log.warning("planner: the job's blocks cannot be timed on %s (%s); the step time is modelled",
                    device, str(e).splitlines()[0][:200])
        return None
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    periods = few_blocks.periods(cfg)
    per_period, per_period_opt = max(0.0, three_s - two_s), max(0.0, three_opt - two_opt)
    return DeviceTiming(block_s=periods * per_period, rest_s=max(0.0, two_s - 2 * per_period),
                        optimizer_s=two_opt + (periods - 2) * per_period_opt)


def _seconds(cfg: Config, micro_batch: int, seq_len: int, casting: Casting, device: str) -> tuple[float, float]:
    from framework.parallel.compile import compile_blocks
    from framework.parallel.float8 import convert_float8
    from framework.parallel.precision import compute_dtype
    from framework.plan.activations import job_model
    spec = spec_for(cfg.model)
    with torch.device(device):
        model = job_model(cfg, spec, casting)
    convert_float8(model, cfg.precision, spec, fsdp=False)
    compile_blocks(model, cfg, spec)
    dtype = compute_dtype(cfg.precision.name)
    optimizer = OptimizerFactory(cfg.optimizer, spec.output_heads())(model)
    vocab = int(cfg.model.get("vocab_size") or cfg.data.vocab_size)
    tokens = torch.randint(0, vocab, (micro_batch, seq_len + 1), device=device)
    autocasts = casting.autocast and cfg.precision.name in ("bf16", "fp16", "float8")
    kind = torch.device(device).type

    def autocast():
        return torch.autocast(kind, dtype=dtype, enabled=autocasts)

    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    try:
        return time_steps(model, optimizer, tokens, REPEATS, autocast, sync)
    finally:
        del model, optimizer
