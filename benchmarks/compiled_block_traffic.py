"""What a compiled Llama block reads and writes outside its matmuls and attention, as the planner counts it
(framework/plan/op_costs.py `fused_bytes`: pointwise and reduction work fused between the heavy ops) and as
inductor counts it (torch._inductor.metrics, the bytes each generated kernel reads and writes), for one
block's forward and backward, compiled by inductor on this CPU.

    python benchmarks/compiled_block_traffic.py [--dim 512 --seq 512]

The planner's count is the least a fusing compiler can move; inductor's is what it generated here, where
some of its choices are a CPU's (the layout attention's CPU kernel wants). A ratio far from the printed
range means the planner's compiled step time (plan/gpu_time.py) no longer describes what compile does.
"""
from __future__ import annotations

import argparse
import logging

import torch
import torch._inductor.config as inductor_config
from hydra import compose, initialize_config_dir
from torch._inductor import metrics
from torch._inductor.scheduler import ExternKernelSchedulerNode, NopKernelSchedulerNode

from framework.config.paths import CONFIG_DIR
from framework.compose.config_store import register_configs
from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.parallel.blocks import find_blocks
from framework.plan import activations, attention_kernel, op_costs
from framework.plan.layout import Casting

CASTINGS = {"fp32 weights, bf16 autocast": Casting(), "bf16 weights (FSDP2, DeepSpeed)": Casting(True, False)}
AC = {"none": [], "op, every 2nd matmul": ["activation_checkpointing=selective", "activation_checkpointing.mode=op",
                                           "activation_checkpointing.save_every_nth_matmul=2"],
      "full": ["activation_checkpointing=full"]}


def _config(dim: int, seq: int, ac: list[str]):
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose("config", overrides=[
            "model=llama_125m", f"model.dim={dim}", "model.n_layers=1", f"model.n_heads={dim // 64}",
            f"model.n_kv_heads={max(1, dim // 256)}", "model.vocab_size=512", "data=synthetic",
            "data.vocab_size=512", f"data.seq_len={seq}", "precision=bf16", *ac])


def inductor_bytes(cfg, casting: Casting) -> tuple[int, int]:
    """(bytes, kernels) of the generated kernels other than matmuls and attention, forward and backward."""
    spec = spec_for(cfg.model)
    torch.manual_seed(0)
    model = activations.job_model(cfg, spec, casting)
    for _, block in find_blocks(model, spec.block_classes(model)):
        block.compile()
    tokens = torch.randint(0, cfg.data.vocab_size, (1, cfg.data.seq_len))
    torch._dynamo.reset()
    metrics.reset()
    with activations.job_autocast(cfg.precision.name, casting):
        loss = cross_entropy(model(tokens), tokens)
    loss.backward()
    fused = [elems for node, elems in metrics.nodes_num_elem
             if not isinstance(node, (ExternKernelSchedulerNode, NopKernelSchedulerNode))]
    return sum(fused) * 4, len(fused)      # nodes_num_elem holds each kernel's bytes / 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--seq", type=int, default=512)
    args = ap.parse_args()
    torch._logging.set_logs(inductor_metrics=True)         # inductor counts bytes only when this log is on
    logging.getLogger("torch._inductor.compile_fx").setLevel(logging.WARNING)
    inductor_config.fx_graph_cache = False                  # a cached graph skips the scheduler that counts
    print(f"{'weights':<34}{'AC':<22}{'planned MB':>11}{'inductor MB':>13}{'ratio':>7}{'kernels':>9}")
    for name, casting in CASTINGS.items():
        for ac_name, ac in AC.items():
            cfg = _config(args.dim, args.seq, ac)
            planned = op_costs.traced(cfg, 1, args.seq, attention_kernel.FUSED, casting).fused_bytes["block"]
            got, kernels = inductor_bytes(cfg, casting)
            print(f"{name:<34}{ac_name:<22}{planned / 1e6:>11.1f}{got / 1e6:>13.1f}{got / planned:>7.2f}{kernels:>9}",
                  flush=True)


if __name__ == "__main__":
    main()
