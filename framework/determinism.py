"""trainer.deterministic: the same seed gives the same run on a GPU too (a CPU run always repeats).

`apply(cfg)` runs first thing in every worker, before CUDA or NCCL start there (spawned, forked
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

import torch

from framework.errors import ConfigError

ENVIRONMENT = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def validate(cfg, strategy_cls) -> None:
    reason = getattr(strategy_cls, "deterministic_refusal", None)
    if cfg.trainer.deterministic and reason:
        raise ConfigError("trainer.deterministic", f"parallel={strategy_cls.name} {reason}")


def apply(cfg) -> None:
    """Make this process's training repeat exactly; nothing changes with trainer.deterministic=false."""
    if not cfg.trainer.deterministic:
        return
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)


def settings() -> dict:
    """What apply() decides, as this process has it (a worker reports it to prove the switch)."""
    return {**{name: os.environ.get(name) for name in ENVIRONMENT},
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "flash_sdp": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient_sdp": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math_sdp": torch.backends.cuda.math_sdp_enabled()}
