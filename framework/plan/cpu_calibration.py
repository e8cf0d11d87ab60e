"""On the CPU the planner times the model itself: one micro-batch's forward, loss and backward, and one
optimizer step (clipping included), on every core. A small transformer on a CPU
spends more than half its step in element-wise operators (norms, activations, residual adds, softmax)
that run at memory speed, not at the matmul rate, and its optimizer step is a fixed cost per tensor; a
fixed share of the matmul peak mispredicted such models by 1.5-2x (benchmarks/plan_step_time.py).
Timing takes at most a few seconds: a micro-batch expected to take longer than MAX_TIMED_S is not
timed (the fixed share stays), and smaller ones are timed up to REPEATS times within that budget; the
median is used, as the job's own step time is (two threads on two busy cores stall now and then)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from omegaconf import OmegaConf

from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.optim.factory import OptimizerFactory
from framework.plan.device_timing import WARMUPS, median, time_steps

if TYPE_CHECKING:
    from framework.config.schema import Config

MAX_TIMED_S = 1.0      # the longest micro-batch (at the fixed share's estimate) that is timed
BUDGET_S = 3.0         # for all rounds of one micro-batch size and thread count
REPEATS = 8


@dataclass(frozen=True)
class CpuTiming:
    efficiency: float       # model FLOPs of a micro-batch / (its forward + backward time x the threads' peak)
    optimizer_s: float      # one clipped optimizer step over the whole model, zero_grad included


def measured_timing(cfg: Config, micro_batch: int, seq_len: int, threads: int, flops_per_token: float,
                    peak: float, fixed_share: float) -> CpuTiming | None:
    """This CPU's timing of the job's fp32 model with `threads` threads (whose matmul peak is `peak`), or
    None where the model is not timed (too large, or it cannot run here)."""
    flops = flops_per_token * micro_batch * seq_len
    estimate = flops / (peak * fixed_share)
    if estimate > MAX_TIMED_S:
        return None
    repeats = max(2, min(REPEATS, int(BUDGET_S / estimate) - WARMUPS))
    key = (OmegaConf.to_yaml(cfg.model, resolve=True), OmegaConf.to_yaml(cfg.optimizer, resolve=True))
    seconds = _seconds(*key, int(cfg.data.vocab_size), micro_batch, seq_len, threads, repeats)
    if seconds is None:
        return None
    micro_s, optimizer_s = seconds
    return CpuTiming(flops / (micro_s * peak), optimizer_s)


@lru_cache(maxsize=32)
def _seconds(model_yaml: str, optimizer_yaml: str, data_vocab: int, micro_batch: int, seq_len: int,
             threads: int, repeats: int) -> tuple[float, float] | None:
    model_cfg = OmegaConf.create(model_yaml)
    spec = spec_for(model_cfg)
    vocab = int(model_cfg.get("vocab_size") or data_vocab)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.device("cpu"):
            model = spec.build(model_cfg)
        optimizer = OptimizerFactory(OmegaConf.create(optimizer_yaml))(model.parameters())
        tokens = torch.randint(0, vocab, (micro_batch, seq_len + 1))
        return time_steps(model, optimizer, tokens, repeats)
    except Exception:       # a model that cannot run on this CPU: the planner keeps its fixed share
        return None
    finally:
        torch.set_num_threads(before)


def tensor_parallel_overhead_s(cfg: Config, seq_len: int, tp: int, sequence_parallel: bool) -> float:
    """Seconds a tensor-parallel rank spends on one micro-batch's forward and backward beyond its 1/tp share
    of the plain model's time, on one core: DTensor's dispatch (sharding propagation, redistribution,
    the functional collectives' wrappers) around every sharded linear and, with sequence parallelism,
    around the norms and residual adds of the sequence-sharded stream too, plus what tp leaves whole
    (the gathered logits and their loss). Dispatch is a cost per operator, not per token (`small` at tp2:
    35-45 ms a micro-batch here), so one sequence shows it.
    Timed on the job's model and the spec's own plan over a fake process group of `tp` ranks (nothing
    moves; the collectives' latency is the planner's separate term), with one sequence. 0.0 where the
    model has no plan or cannot run so, and where this process already has a process group."""
    key = OmegaConf.to_yaml(cfg.model, resolve=True)
    return _tensor_parallel_overhead_s(key, int(cfg.data.vocab_size), seq_len, tp, sequence_parallel)


@lru_cache(maxsize=16)
def _tensor_parallel_overhead_s(model_yaml: str, data_vocab: int, seq_len: int, tp: int,
                                sequence_parallel: bool) -> float:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from framework.parallel.tensor_parallel import apply_tensor_parallel
    from framework.parallel.tied import retie

    if dist.is_initialized():
        return 0.0
    model_cfg = OmegaConf.create(model_yaml)
    spec = spec_for(model_cfg)
    vocab = int(model_cfg.get("vocab_size") or data_vocab)
    tokens = torch.randint(0, vocab, (1, seq_len + 1))

    def seconds(model: torch.nn.Module) -> float:
        times = []
        for _ in range(WARMUPS + REPEATS):
            start = time.perf_counter()
            cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            times.append(time.perf_counter() - start)
        return median(times[WARMUPS:])

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        with torch.device("cpu"):
            plain, sharded = spec.build(model_cfg), spec.build(model_cfg)
        plan = spec.tensor_parallel_plan(sharded, sequence_parallel)
        if not plan:
            return 0.0
        apply_tensor_parallel(sharded, init_device_mesh("cpu", (tp,)), plan)
        retie(sharded, spec.tied_parameters(model_cfg))
        return max(0.0, seconds(sharded) - seconds(plain) / tp)
    except Exception:       # a model whose plan does not run over a fake group: nothing is added
        return 0.0
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(before)
