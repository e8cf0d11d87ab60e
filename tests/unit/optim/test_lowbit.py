"""optimizer=adamw_8bit in one process equals torchao.optim.AdamW8bit used directly (bitwise, with the LR schedule),
resumes through the checkpoint's own save and load (torchao keeps lr as a tensor), and the planner's state bytes
equal what the framework measures of its states (codes, block scales and quantisation maps).

torchao compiles its step once per parameter shape (seconds with a warm inductor cache, tens of seconds cold):
one model of two shapes serves every test here, a 64x64 matrix (quantised: 4096 values) and its bias (fp32)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from framework.checkpoint import dcp_state
from framework.metrics.memory import local_bytes
from framework.optim.factory import OptimizerFactory
from framework.optim.schedulers import build_scheduler
from framework.plan.model_states import OptimizerKind
from tests.unit.optim.test_schedulers import NoPrecision, hand_curve

torchao_optim = pytest.importorskip("torchao.optim")

STEPS, WARMUP = 6, 1
SCHEDULE = SimpleNamespace(name="wsd", warmup_steps=WARMUP, decay_fraction=0.5, decay_type="linear", min_lr_ratio=0.1)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))


def train(model, opt, sched, steps):
    lrs = []
    for k in steps:
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(k))
        model(x).square().mean().backward()
        lrs.append(float(opt.param_groups[0]["lr"]))
        opt.step()
        opt.zero_grad()
        sched.step()
    return lrs


@pytest.fixture(scope="module")
def optimizer_cfg(compose_config):
    return compose_config(["model=tiny", "optimizer=adamw_8bit"]).optimizer


def framework_run(optimizer_cfg, max_steps=STEPS):
    model = make_model()
    opt = OptimizerFactory(optimizer_cfg)(model)
    return model, opt, build_scheduler(opt, SCHEDULE, max_steps)


def test_adamw_8bit_equals_torchao_used_directly(optimizer_cfg):
    model, opt, sched = framework_run(optimizer_cfg)
    assert type(opt) is torchao_optim.AdamW8bit
    lrs = train(model, opt, sched, range(STEPS))

    ref = make_model()
    matrices = [p for p in ref.parameters() if p.ndim == 2]
    biases = [p for p in ref.parameters() if p.ndim == 1]
    ref_opt = torchao_optim.AdamW8bit([{"params": matrices, "weight_decay": 0.1},
                                       {"params": biases, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, block_size=256)
    curve = hand_curve(STEPS, WARMUP, 0.5, "linear", 0.1) + [0.1]    # LambdaLR also asks for the step after
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda k: curve[k])
    assert lrs == train(ref, ref_opt, ref_sched, range(STEPS))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_adamw_8bit_resumes_exactly_through_the_checkpoint(optimizer_cfg, tmp_path):
    model, opt, sched = framework_run(optimizer_cfg)
    lrs = train(model, opt, sched, range(STEPS))

    before, opt2, sched2 = framework_run(optimizer_cfg)
    resumed_lrs = train(before, opt2, sched2, range(3))
    dcp_state.save(str(tmp_path / "ckpt"), before, opt2, sched2, NoPrecision())
    after, opt3, sched3 = framework_run(optimizer_cfg)
    dcp_state.load(str(tmp_path / "ckpt"), after, opt3, sched3, NoPrecision())
    assert torch.is_tensor(opt3.param_groups[0]["lr"])       # torchao refuses a float lr at its next step
    resumed_lrs += train(after, opt3, sched3, range(3, STEPS))
    assert resumed_lrs == lrs
    assert all(torch.equal(p, q) for p, q in zip(after.parameters(), model.parameters()))


def test_the_planned_state_bytes_are_the_measured(optimizer_cfg):
    model, opt, sched = framework_run(optimizer_cfg)
    train(model, opt, sched, range(1))
    kind = OptimizerKind.of(optimizer_cfg)
    for p in model.parameters():
        measured = sum(local_bytes(t) for t in opt.state[p].values())
        assert kind.bytes_for(p.numel()) == measured, tuple(p.shape)
    weight = model[0].weight
    assert type(opt.state[weight]["exp_avg"]).__name__ == "OptimState8bit"     # quantised, the bias not
    assert sum(local_bytes(t) for t in opt.state[weight].values()) < 3 * weight.numel()
