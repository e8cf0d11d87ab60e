"""FSDP2 (`fully_shard`) over a data-parallel DeviceMesh: every block, then the root.

Mesh-agnostic: pass a 1-D mesh (plain sharding, ZeRO-2/3), a 2-D (replicate, shard) mesh (HSDP),
or the data-parallel sub-mesh of a bigger TP/PP mesh. Apply after tensor parallelism and
activation checkpointing, as torch's composable APIs expect.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from framework.parallel.blocks import find_blocks
from framework.parallel.precision import DTYPES


def mixed_precision_policy(precision_cfg) -> MixedPrecisionPolicy:
    """precision.* as FSDP2 sees it: parameters all-gathered in param_dtype, gradients reduced in
    reduce_dtype; the sharded fp32 parameters stay the optimizer's master weights."""
    param = DTYPES[precision_cfg.param_dtype]
    reduce = DTYPES[precision_cfg.reduce_dtype]
    if param == torch.float32 and reduce == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, *, reshard_after_forward: bool = True,
               mp_policy: Optional[MixedPrecisionPolicy] = None, offload: bool = False,
               block_classes: Iterable[str | type] = (), ignored_params: Optional[set] = None) -> nn.Module:
    """Shard `model` in place over `mesh` and return it.

    reshard_after_forward: True frees gathered parameters after each block's forward (ZeRO-3),
    False keeps them until backward (ZeRO-2). block_classes: class names or classes whose instances
    become their own FSDP unit; empty = the model's `block_classes()`. ignored_params: parameters sharded
    otherwise (expert parallelism) that FSDP neither shards nor reduces.
    """
    kwargs = dict(mesh=mesh, reshard_after_forward=reshard_after_forward,
                  mp_policy=mp_policy or MixedPrecisionPolicy(),
                  offload_policy=CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if offload else OffloadPolicy(),
                  ignored_params=ignored_params or None)
    # Innermost first: fully_shard on a parent leaves out parameters its children already manage.
    for _, block in reversed(find_blocks(model, block_classes)):
        fully_shard(block, **kwargs)
    # The root (embedding, final norm, head) stays gathered from its forward to its backward, which follows
    # at once (torch's own choice for a root); a chunked loss (model.loss_chunk_tokens) runs the head then.
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    return model


def reshard(model: nn.Module) -> None:
    """Free what FSDP2 gathered and still holds: a forward without a backward after it (a model only read, such as
    a preference objective's reference) leaves the root's parameters, which reshard only after backward, whole."""
    from torch.distributed.fsdp import FSDPModule
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
