"""What a Llama block keeps for backward, eager and compiled by inductor (which partitions a compiled block on
a CPU as on a GPU), next to what the planner's fake-tensor trace (framework/plan/activations.py) says, with
fp32 weights under bf16 autocast (single, ddp) and with bf16 weights (FSDP2's policy, DeepSpeed's engine).

    python benchmarks/compiled_activation_bytes.py [--dim 256 --seq 256]

Bytes per token of the middle of three blocks: every tensor autograd saved during that block's forward
(its input included, not parameters, not the RoPE rows every block shares) against the plan's bytes for
that block (where the block's output, the next one's input, is counted).
"""
from __future__ import annotations

import argparse

import torch
from hydra import compose, initialize_config_dir

from framework.config.paths import CONFIG_DIR
from framework.compose.config_store import register_configs
from framework.models.loss import cross_entropy
from framework.models.spec import spec_for
from framework.parallel.blocks import find_blocks
from framework.plan import activations
from framework.plan.layout import Casting


def measured(cfg, casting: Casting, compiled: bool) -> float:
    spec = spec_for(cfg.model)
    torch.manual_seed(0)
    model = spec.build(cfg.model)
    if casting.weights:
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    blocks = [b for _, b in find_blocks(model, spec.block_classes(model))]
    if compiled:
        for b in blocks:
            b.compile()
    inside, saved = [None], {}
    for i, b in enumerate(blocks):
        b.register_forward_pre_hook(lambda m, a, i=i: inside.__setitem__(0, i))
        b.register_forward_hook(lambda m, a, o: inside.__setitem__(0, None))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    rope = cfg.model.dim // cfg.model.n_heads // 2

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and inside[0] == 1 and tuple(t.shape)[-2:] != (1, rope):
            saved[s.data_ptr()] = s.nbytes()
        return t
    seq = cfg.data.seq_len
    tokens = torch.randint(0, cfg.model.vocab_size, (1, seq))
    for _ in range(2):          # the second step: compiled code is warm
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=casting.autocast):
            loss = cross_entropy(model(tokens), tokens)
        loss.backward()
    return sum(saved.values()) / seq


def planned(cfg, casting: Casting, compiled: bool) -> float:
    profile = activations.measure(cfg, 1, cfg.data.seq_len, casting=casting)
    return sum((profile.compiled if compiled else profile).blocks[1].values()) / cfg.data.seq_len


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=[
            "model=llama_125m", f"model.dim={args.dim}", "model.n_layers=3", f"model.n_heads={args.dim // 64}",
            f"model.n_kv_heads={max(1, args.dim // 128)}", "model.vocab_size=512", "data=synthetic",
            "data.vocab_size=512", f"data.seq_len={args.seq}", "precision=bf16"])
    print(f"{'weights':<24}{'block':<10}{'measured B/token':>18}{'planned':>10}{'ratio':>8}")
    for name, casting in (("fp32 under autocast", Casting()), ("bf16 (FSDP2, DeepSpeed)", Casting(True, False))):
        for compiled in (False, True):
            got, plan = measured(cfg, casting, compiled), planned(cfg, casting, compiled)
            print(f"{name:<24}{'compiled' if compiled else 'eager':<10}{got:>18,.0f}{plan:>10,.0f}{plan / got:>8.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
