"""Which Adam kernel DeepSpeed's own optimizer (parallel.use_deepspeed_optimizer) runs on CUDA.

DeepSpeed builds FusedAdam (DeepSpeedCPUAdam when optimizer states are offloaded), compiled on first
use with nvcc and the CUDA toolkit unless the op was prebuilt when deepspeed was installed
(DS_BUILD_FUSED_ADAM=1, DS_BUILD_CPU_ADAM=1). pip-installed torch brings no nvcc, so unless the op
is prebuilt the optimizer section asks for torch's Adam(W) (`torch_adam`), which needs no build.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from framework.errors import ConfigError
from framework.runtime.devices import device_type

if TYPE_CHECKING:
    from framework.config.schema import Config


def skip_inference_comm_op() -> None:
    """DeepSpeed's comm layer compiles a shared-memory all-reduce op (a C++ build of minutes on a fresh
    machine, done again whenever another deepspeed install used the same extensions dir) for its
    inference all-reduce, which training never calls: declare the op unavailable so it is not built."""
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def adam_op(cfg: Config) -> str:
    """The DeepSpeed op its Adam would need: cpu_adam steps offloaded states, fused_adam GPU ones."""
    return "cpu_adam" if cfg.zero.offload_optimizer else "fused_adam"


def prebuilt(op: str) -> bool:
    from deepspeed.git_version_info import installed_ops
    return bool(installed_ops.get(op))


def has_nvcc() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return CUDA_HOME is not None and os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc"))


def choose_adam_kernel(cfg: Config, ds: dict, source: str) -> None:
    """Set optimizer.params.torch_adam in the resolved DeepSpeed config where DeepSpeed's kernel
    would have to be compiled; refuse an explicit torch_adam=false that cannot be."""
    section = ds.get("optimizer")
    if section is None or device_type(cfg) != "cuda":
        return
    op = adam_op(cfg)
    if prebuilt(op):
        return
    params = section.setdefault("params", {})
    if "torch_adam" not in params:
        params["torch_adam"] = True
    elif params["torch_adam"] is False and not has_nvcc():
        raise ConfigError(source, f"optimizer.params.torch_adam=false asks for DeepSpeed's {op} kernel, which this "
                                  f"deepspeed install did not prebuild and which compiles with nvcc at run time, "
                                  f"but there is no nvcc (CUDA_HOME); remove torch_adam to step with torch's Adam, "
                                  f"or reinstall deepspeed with DS_BUILD_{op.upper()}=1")
