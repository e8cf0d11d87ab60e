"""float8 training: torchao's Float8Linear in place of the transformer blocks' nn.Linear layers.

Only linears inside the model's blocks convert (the embedding and output head keep bf16: their
precision matters most and the head's logits are upcast anyway), and only those whose dims divide
by 16 (float8 matmul kernels need it). The converted linear keeps its weight as an fp32 nn.Parameter
under the same name, so checkpoints load either way between a float8 and a bf16 run. With the
tensorwise recipe FSDP2 all-gathers the weights in float8 (one byte a parameter). Apply before
tensor parallelism, checkpointing, compile and FSDP, as torchtitan's converters do.
"""
from __future__ import annotations

import dataclasses

from torch import nn

from framework.parallel.blocks import find_blocks


def convert_float8(model: nn.Module, precision_cfg, block_classes, fsdp: bool) -> list[str]:
    """Convert the blocks' linears in place when precision=float8; return the converted names."""
    if precision_cfg.name != "float8":
        return []
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(precision_cfg.float8_recipe)
    config = dataclasses.replace(
        config, emulate=precision_cfg.float8_emulate,
        enable_fsdp_float8_all_gather=fsdp and precision_cfg.float8_recipe == "tensorwise")
    blocks = tuple(name + "." for name, _ in find_blocks(model, block_classes))
    converted = []

    def in_a_block(module: nn.Module, fqn: str) -> bool:
        keep = (isinstance(module, nn.Linear) and fqn.startswith(blocks)
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)
        if keep:
            converted.append(fqn)
        return keep

    convert_to_float8_training(model, config=config, module_filter_fn=in_a_block)
    return converted
