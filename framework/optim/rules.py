"""The optimizer's and the schedule's config rules (run at admission, before any worker)."""
from __future__ import annotations

import importlib.util
import re

from framework.errors import ConfigError
from framework.optim.groups import canonical


def steps_whole_tensors(cls) -> str | None:
    """Why an optimizer class needs each parameter's own tensor (None: it steps any flat buffer alike)."""
    if getattr(cls, "ALGORITHMS", None) is not None:
        return ("Muon orthogonalises whole matrices (DeepSpeed's own Muon picks its matrices by name and does not "
                "give torch.optim.Muon's update)")
    if cls.__module__.startswith("torchao."):
        return "torchao's optimizers step each parameter's own tensor (low-bit blocks, the 4096-element threshold)"
    return None


def validate_optimizer_extra(cfg) -> None:
    """An optimizer of an extra that is not installed: the install line, before the generic import error."""
    if cfg.optimizer._target_.startswith("torchao.") and importlib.util.find_spec("torchao") is None:
        raise ConfigError("optimizer._target_", f"{cfg.optimizer._target_} needs torchao: "
                                                f"pip install 'framework[lowbit]'")


def validate_optimizer(cfg, cls, strategy_cls, skeleton) -> None:
    """cls: optimizer._target_'s class; skeleton(): the model on the meta device (for optimizer.groups' names)."""
    if cfg.optimizer.get("bf16_stochastic_round") is not None:
        if "bfloat16" not in strategy_cls.store_dtypes:
            raise ConfigError("optimizer", f"{cfg.optimizer._target_} steps bf16 parameters, which parallel="
                                           f"{strategy_cls.name} does not keep: {strategy_cls.store_dtype_note}")
        if cfg.precision.get("store_dtype") != "bfloat16":
            raise ConfigError("optimizer", f"{cfg.optimizer._target_} steps bf16 parameters (its moments take their "
                                           f"dtype); set precision=bf16 precision.store_dtype=bfloat16, or "
                                           f"optimizer=adamw for fp32 parameters")
    why = steps_whole_tensors(cls)
    if why and strategy_cls.flat_optimizer_partitions:
        raise ConfigError("optimizer", f"{cfg.optimizer._target_} is refused under parallel={strategy_cls.name}: "
                                       f"{why}, and ZeRO steps flattened partitions of many parameters; use "
                                       f"parallel=fsdp (zero=stage1-3 shard the same way) or parallel=ddp")
    groups = cfg.optimizer.get("groups") or []
    if groups:
        _validate_groups(cfg, groups, getattr(cls, "ALGORITHMS", None), skeleton())
    if cfg.scheduler.get("decay_fraction") is not None and not 0 <= cfg.scheduler.decay_fraction <= 1:
        raise ConfigError("scheduler.decay_fraction", f"must be in [0, 1], got {cfg.scheduler.decay_fraction}")


def _validate_groups(cfg, groups, algorithms, model) -> None:
    names = [canonical(n) for n, _ in model.named_parameters()]
    for i, group in enumerate(groups):
        key = f"optimizer.groups[{i}]"
        try:
            pattern = re.compile(group.pattern)
        except re.error as e:
            raise ConfigError(f"{key}.pattern", f"{group.pattern!r} is not a regular expression: {e}") from None
        if not any(pattern.search(n) for n in names):
            raise ConfigError(f"{key}.pattern", f"{group.pattern!r} matches no parameter of the model "
                                                f"(names such as {', '.join(names[:3])})")
        if group.lr_scale <= 0:
            raise ConfigError(f"{key}.lr_scale", f"must be positive, got {group.lr_scale}")
        if group.algorithm is not None and algorithms is None:
            raise ConfigError(f"{key}.algorithm", f"chooses between Muon's and AdamW's update: only optimizer=muon "
                                                  f"has both, not {cfg.optimizer._target_}")
        if group.algorithm == "muon":
            bad = [n for n, p in model.named_parameters() if pattern.search(canonical(n)) and p.ndim != 2]
            if bad:
                raise ConfigError(f"{key}.algorithm", f"muon steps 2-D matrices only; {bad[0]} is not one")
