"""The optimizer named by `optimizer._target_`, with weight decay only on matrices."""
from __future__ import annotations

from hydra.utils import get_class
from omegaconf import OmegaConf


def _ndim(p) -> int:
    # A parameter partitioned at construction (DeepSpeed zero.Init) is an empty 1-D placeholder whose
    # logical shape is ds_shape: its weight decay must follow that shape, not the placeholder's.
    return len(getattr(p, "ds_shape", p.shape))


class OptimizerFactory:
    def __init__(self, opt_cfg):
        kwargs = OmegaConf.to_container(opt_cfg, resolve=True)
        self.cls = get_class(kwargs.pop("_target_"))
        self.weight_decay = kwargs.pop("weight_decay", 0.0)
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        self.kwargs = {k: v for k, v in kwargs.items() if v is not None}

    def param_groups(self, params) -> list[dict]:
        params = [p for p in params if p.requires_grad]
        decay = [p for p in params if _ndim(p) >= 2]
        no_decay = [p for p in params if _ndim(p) < 2]
        groups = [{"params": decay, "weight_decay": self.weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups

    def __call__(self, params):
        return self.cls(self.param_groups(params), **self.kwargs)
