"""The optimizer named by `optimizer._target_`, over the parameter groups of framework/optim/groups.py."""
from __future__ import annotations

from hydra.utils import get_class
from omegaconf import OmegaConf

from framework.optim import groups


class OptimizerFactory:
    """heads: the model spec's output heads (which Muon leaves to AdamW, with the embeddings)."""

    def __init__(self, opt_cfg, heads: tuple[str, ...] = ()):
        kwargs = OmegaConf.to_container(opt_cfg, resolve=True)
        self.cls = get_class(kwargs.pop("_target_"))
        self.weight_decay = kwargs.pop("weight_decay", 0.0)
        self.groups = opt_cfg.get("groups") or ()
        kwargs.pop("groups", None)
        self.heads = heads
        for key in ("betas", "adamw_betas"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        self.kwargs = {k: v for k, v in kwargs.items() if v is not None}
        self.split = getattr(self.cls, "ALGORITHMS", None) is not None

    def named_groups(self, params) -> list[tuple[dict, list]]:
        """(settings, (name, parameter)s) of each group; params: the model (names, for optimizer.groups and Muon's
        split) or an iterable of parameters."""
        lrs = {None: self.kwargs.get("lr"), "muon": self.kwargs.get("lr"), "adamw": self.kwargs.get("adamw_lr")}
        return groups.named_groups(params, self.weight_decay, self.groups, self.split, lrs, self.heads)

    def param_groups(self, params) -> list[dict]:
        return [{"params": [p for _, p in members], **settings} for settings, members in self.named_groups(params)]

    def __call__(self, params):
        return self.cls(self.param_groups(params), **self.kwargs)
