"""trainer.deterministic: the same seed gives the same run on a GPU too (a CPU run always repeats).

`applied(cfg)` holds every worker's whole run, entered first thing, before CUDA or NCCL start there (spawned, forked
and torchrun workers alike), and sets:
- torch.use_deterministic_algorithms(True): ops with a deterministic variant use it (scatter-add in
  the embedding's backward, index_add, ...); the rest raise instead of differing silently;
- CUBLAS_WORKSPACE_CONFIG=:4096:8, which cuBLAS needs for repeatable matmuls (read when cuBLAS
  starts, hence before CUDA);
- cuDNN deterministic, no benchmark-driven algorithm choice;
- scaled_dot_product_attention on the math backend only: the flash and memory-efficient backends'
  backward accumulate with atomics (their order varies); math is matmuls and a softmax;
- NCCL_ALGO=Ring, NCCL_PROTO=Simple unless set already: NCCL picks ring, tree, NVLS or CollNet and a
  protocol per call from message size and topology, and each sums in another order; one algorithm and
  protocol make the order depend on the ranks alone.

`validate(cfg, strategy_cls)` refuses a strategy that cannot honour it (`deterministic_refusal`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from framework.errors import ConfigError

ENVIRONMENT = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def validate(cfg, strategy_cls) -> None:
    reason = getattr(strategy_cls, "deterministic_refusal", None)
    if cfg.trainer.deterministic and reason:
        raise ConfigError("trainer.deterministic", f"parallel={strategy_cls.name} {reason}")


@contextmanager
def applied(cfg):
    """Make this process's training repeat exactly while the block runs; nothing changes with
    trainer.deterministic=false. On leaving, the process is as it was: a multirun runs its one-process
    points one after another in one process, and a deterministic point must not make the next one
    deterministic (its numbers would then differ from the same point run alone)."""
    if not cfg.trainer.deterministic:
        yield
        return
    before = _switches()
    added = [name for name in ENVIRONMENT if name not in os.environ]
    for name in added:
        os.environ[name] = ENVIRONMENT[name]
    try:
        _set_switches(deterministic_algorithms=True, warn_only=False, cudnn_deterministic=True,
                      cudnn_benchmark=False, flash_sdp=False, mem_efficient_sdp=False, cudnn_sdp=False,
                      math_sdp=True)
        yield
    finally:
        _set_switches(**before)
        for name in added:
            os.environ.pop(name, None)


def _switches() -> dict:
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
            "math_sdp": torch.backends.cuda.math_sdp_enabled()}


def _set_switches(deterministic_algorithms, warn_only, cudnn_deterministic, cudnn_benchmark, flash_sdp,
                  mem_efficient_sdp, cudnn_sdp, math_sdp) -> None:
    torch.use_deterministic_algorithms(deterministic_algorithms, warn_only=warn_only)
    torch.backends.cudnn.deterministic = cudnn_deterministic
    torch.backends.cudnn.benchmark = cudnn_benchmark
    torch.backends.cuda.enable_flash_sdp(flash_sdp)
    torch.backends.cuda.enable_mem_efficient_sdp(mem_efficient_sdp)
    torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    torch.backends.cuda.enable_math_sdp(math_sdp)


def settings() -> dict:
    """What applied() decides, as this process has it (a worker reports it to prove the switch)."""
    return {**{name: os.environ.get(name) for name in ENVIRONMENT},
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math_sdp": torch.backends.cuda.math_sdp_enabled()}
