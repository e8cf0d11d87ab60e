"""The optimizer's parameter groups: weight decay on matrices only, `optimizer.groups` patterns (first match wins)
for a per-module lr scale and weight decay, and, for an optimizer that steps matrices differently (Muon), which
update each parameter gets."""
from __future__ import annotations

import re

from torch import nn

from framework.errors import ConfigError

# what wrappers put into a parameter's name (DDP, torch.compile, activation checkpointing): patterns see the model's
WRAPPER_PARTS = ("module", "_orig_mod", "_checkpoint_wrapped_module")


def canonical(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)


def ndim(p) -> int:
    # A parameter partitioned at construction (DeepSpeed zero.Init) is an empty 1-D placeholder whose
    # logical shape is ds_shape: its weight decay must follow that shape, not the placeholder's.
    return len(getattr(p, "ds_shape", p.shape))


def not_hidden_matrices(model: nn.Module, heads: tuple[str, ...]) -> set[str]:
    """Canonical names of the 2-D parameters that are not hidden matrices: embeddings and the output heads."""
    names = set()
    for module_name, module in model.named_modules():
        leaf = canonical(module_name).rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) or leaf in heads:
            names.update(canonical(f"{module_name}.{n}" if module_name else n)
                         for n, _ in module.named_parameters(recurse=False))
    return names


def named_trainable(params) -> list[tuple[str, nn.Parameter]]:
    """(canonical name, parameter) of a model, or of a plain iterable of parameters (named by position)."""
    named = params.named_parameters() if isinstance(params, nn.Module) else enumerate(params)
    return [(canonical(str(n)), p) for n, p in named if p.requires_grad]


def named_groups(params, weight_decay: float, groups_cfg, split_algorithms: bool, lrs: dict[str, float],
                 heads: tuple[str, ...] = ()) -> list[tuple[dict, list[tuple[str, nn.Parameter]]]]:
    """(the group's settings, its (name, parameter)s): one group per (pattern, algorithm, decays) in the order first
    met, the matrices first; without patterns: the matrices, then the rest. split_algorithms: tag each group
    algorithm=muon (hidden matrices) or adamw (the rest, or as a pattern says); a pattern's lr_scale multiplies its
    algorithm's lr in `lrs` (the optimizer's lr under key None)."""
    named = named_trainable(params)
    patterns = [(i, re.compile(g.pattern), g) for i, g in enumerate(groups_cfg or ())]
    others = not_hidden_matrices(params, heads) if split_algorithms and isinstance(params, nn.Module) else set()
    built: dict[tuple, tuple[dict, list]] = {}
    for name, p in named:
        index, rule = next(((i, g) for i, rx, g in patterns if rx.search(name)), (None, None))
        matrix = ndim(p) >= 2
        decay = weight_decay if matrix else 0.0
        if rule is not None and rule.weight_decay is not None:
            decay = rule.weight_decay
        algorithm = None
        if split_algorithms:
            algorithm = "muon" if ndim(p) == 2 and name not in others else "adamw"
            if rule is not None and rule.algorithm is not None:
                algorithm = rule.algorithm
                if algorithm == "muon" and ndim(p) != 2:
                    raise ConfigError(f"optimizer.groups[{index}].algorithm",
                                      f"muon steps 2-D matrices only; {name} has shape {tuple(p.shape)}")
        key = (index, algorithm, decay, matrix)
        if key not in built:
            settings = {"weight_decay": decay}
            if algorithm is not None:
                settings["algorithm"] = algorithm
            if rule is not None and rule.lr_scale != 1.0:
                settings["lr"] = lrs[algorithm] * rule.lr_scale
            built[key] = (settings, [])
        built[key][1].append((name, p))
    # the matrices first, as the optimizer has always had them (a checkpoint's group order)
    return [built[key] for key in sorted(built, key=lambda key: not key[3])]

