"""`model=hf` with transformers' mixture-of-experts classes: a tiny MixtralForCausalLM from its config.json
trains finite under parallel=single and gives the same losses under ddp; with output_router_logits its
router's load-balancing loss reaches the gradient (Mixtral and Qwen3-MoE)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from framework.models.hf.model import HFCausalLM
from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework

transformers = pytest.importorskip("transformers")

STEPS = 3
BASE = [*(a for a in FAST if a != "model=tiny"), "model=hf", f"trainer.max_steps={STEPS}"]
LAYOUTS = {"single": ["parallel=single"], "ddp": ["parallel=ddp"]}
TOL = 1e-4
SHAPES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
              max_position_embeddings=256, num_experts_per_tok=2, output_router_logits=True)


def configs() -> dict:
    return {"mixtral": transformers.MixtralConfig(**SHAPES, intermediate_size=32, num_local_experts=4,
                                                  router_aux_loss_coef=0.01),
            "qwen3_moe": transformers.Qwen3MoeConfig(**SHAPES, intermediate_size=32, moe_intermediate_size=32,
                                                     num_experts=4, router_aux_loss_coef=0.01)}


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_moe")
    for name, config in configs().items():
        config.save_pretrained(root / name)
    return {name: root / name for name in configs()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, config_dirs):
    done = {}

    def get(layout: str) -> list[dict]:
        if layout not in done:
            run_dir = tmp_path_factory.mktemp(f"mixtral_{layout}")
            check_ok(run_framework([*BASE, f"model.config={config_dirs['mixtral']}", *LAYOUTS[layout]], run_dir))
            done[layout] = read_metrics(run_dir)
        return done[layout]
    return get


def test_hf_mixtral_trains_under_single_and_ddp_matches_it(runs):
    single, ddp = runs("single"), runs("ddp")
    assert [r["step"] for r in single] == [r["step"] for r in ddp] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in single)
    for a, b in zip(single, ddp):
        assert abs(a["loss"] - b["loss"]) <= TOL, (a["step"], a["loss"], b["loss"])


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("router_logits", [True, False])
def test_router_load_balancing_loss_reaches_the_gradient(config_dirs, name, router_logits):
    config = transformers.AutoConfig.from_pretrained(config_dirs[name])
    config.output_router_logits = router_logits
    config.save_pretrained(config_dirs[name].parent / f"{name}_{router_logits}")
    torch.manual_seed(0)
    model = HFCausalLM(config=str(config_dirs[name].parent / f"{name}_{router_logits}")).train()
    logits = model(torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0)))
    (logits.sum() * 0).backward()           # only the auxiliary loss can give the router a gradient
    grads = [p.grad for n, p in model.named_parameters() if n.endswith("gate.weight")]
    assert grads and all(g is not None for g in grads)
    assert any(g.abs().sum() > 0 for g in grads) == router_logits
