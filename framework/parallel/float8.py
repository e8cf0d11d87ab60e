"""float8 training: torchao's Float8Linear in place of the transformer blocks' nn.Linear layers.

Only linears inside the model's blocks convert (the embedding and output head keep bf16: their
precision matters most and the head's logits are upcast anyway), and only those whose dims divide
by 16 (float8 matmul kernels need it); the linears the model spec keeps (`float8_kept`: an MoE router's
gate, whose scores pick the experts, as torchtitan leaves routers out) stay too. The converted linear
keeps its weight as an fp32 nn.Parameter under the same name, so checkpoints load either way between a
float8 and a bf16 run. With the tensorwise recipe FSDP2 all-gathers the weights in float8 (one byte a
parameter); each weight's scale then needs the amax over its shards, which torchao gathers for all of
them in one all-reduce when `precompute_fsdp_scales` runs after each optimizer step (else one all-reduce
per weight per all-gather). Apply before tensor parallelism, checkpointing, compile and FSDP, as
torchtitan's converters do.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable

from torch import nn

from framework.parallel.blocks import find_blocks

if TYPE_CHECKING:
    from framework.models.spec import ModelSpec


def gathers_float8(precision_cfg, fsdp: bool) -> bool:
    """Whether FSDP2 all-gathers the converted weights in float8 (tensorwise scales)."""
    return precision_cfg.name == "float8" and fsdp and precision_cfg.float8_recipe == "tensorwise"


def _named(fqn: str, names: Iterable[str]) -> bool:
    return any(fqn == name or fqn.endswith("." + name) for name in names)


def worker_modules(precision_cfg) -> tuple[str, ...]:
    """What convert_float8 imports: torchao's float8 and the inductor codegen module it patches (~1 s of CPU)."""
    return ("torchao.float8", "torch._inductor.codegen.triton") if precision_cfg.name == "float8" else ()


def convert_float8(model: nn.Module, precision_cfg, spec: "ModelSpec", fsdp: bool) -> list[str]:
    """Convert the blocks' linears in place when precision=float8; return the converted names."""
    if precision_cfg.name != "float8":
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(precision_cfg.float8_recipe)
    config = dataclasses.replace(config, emulate=precision_cfg.float8_emulate,
                                 enable_fsdp_float8_all_gather=gathers_float8(precision_cfg, fsdp))
    blocks = tuple(name + "." for name, _ in find_blocks(model, spec.block_classes(model)))
    converted = []

    def in_a_block(module: nn.Module, fqn: str) -> bool:
        keep = (isinstance(module, nn.Linear) and fqn.startswith(blocks) and not _named(fqn, spec.float8_kept)
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)
        if keep:
            converted.append(fqn)
        return keep

    convert_to_float8_training(model, config=config, module_filter_fn=in_a_block)
    return converted


def precompute_fsdp_scales(modules: Iterable[nn.Module]) -> None:
    """The next all-gathers' float8 scales of every converted weight, from one all-reduce of their amaxes
    (torchao); call after each optimizer step where gathers_float8."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
    for module in modules:
        precompute_float8_dynamic_scale_for_fsdp(module)
