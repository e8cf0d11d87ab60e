"""Tensor parallelism: apply a model's plan (module name -> DTensor ParallelStyle) over the tp mesh.

The plan lives beside its model (e.g. framework/models/llama/parallelize.py); this module only
applies it, skipping entries for submodules a pipeline stage does not hold.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module


def _holds(model: nn.Module, name: str) -> bool:
    try:
        return model.get_submodule(name) is not None
    except AttributeError:
        return False


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> nn.Module:
    """Parallelize `model` in place; plan keys are dotted submodule names without wildcards."""
    if tp_mesh.size() == 1:
        return model
    present = {name: style for name, style in plan.items() if _holds(model, name)}
    return parallelize_module(model, tp_mesh, present)
