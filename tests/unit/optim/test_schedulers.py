"""The LR schedules against a hand-written curve, and their resume through the checkpoint's own save and load:
exact across the decay's start, and a run extended with a larger trainer.max_steps follows the new schedule."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from framework.checkpoint import dcp_state
from framework.optim.schedulers import build_scheduler


def hand_curve(T, W, f, decay_type, m):
    """Three explicit phases, one list each: warm-up to 1, the stable 1s, then the decay to m at step T."""
    D = min(round(f * T), T - W)
    warm = [(i + 1) / W for i in range(W)]
    stable = [1.0] * (T - W - D)
    shape = {"linear": lambda p: 1 - p, "sqrt": lambda p: 1 - p ** 0.5,
             "cosine": lambda p: (1 + math.cos(math.pi * p)) / 2}[decay_type]
    return warm + stable + [m + (1 - m) * shape(j / D) for j in range(D)]


def sched_cfg(name, warmup=0, fraction=0.2, decay_type="linear", min_lr_ratio=0.1):
    return SimpleNamespace(name=name, warmup_steps=warmup, decay_fraction=fraction, decay_type=decay_type,
                           min_lr_ratio=min_lr_ratio)


def curve(cfg, T):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, cfg, T)
    lrs = []
    for _ in range(T):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("decay_type", ["linear", "sqrt", "cosine"])
def test_wsd_equals_the_hand_written_curve_at_every_step(decay_type):
    for T in (1, 2, 7, 10, 100):
        for W in sorted({0, 1, 5, T // 10}):
            if W > T:
                continue
            for f in (0.0, 0.1, 0.2, 0.5, 1.0):
                for m in (0.0, 0.1):
                    got = curve(sched_cfg("wsd", W, f, decay_type, m), T)
                    want = hand_curve(T, W, f, decay_type, m)
                    assert got == pytest.approx(want, abs=1e-12, rel=0), (T, W, f, m)


def test_the_fixed_schedules_are_wsd_with_their_decay():
    T, W = 50, 5
    assert curve(sched_cfg("cosine", W), T) == curve(sched_cfg("wsd", W, 1.0, "cosine"), T)
    assert curve(sched_cfg("linear", W), T) == pytest.approx(hand_curve(T, W, 1.0, "linear", 0.1), abs=1e-12)
    assert curve(sched_cfg("constant", W), T) == hand_curve(T, W, 0.0, "linear", 0.1)
    # the cosine the framework had before WSD, written out
    cosine = [(k + 1) / W if k < W else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (k - W) / (T - W)))
              for k in range(T)]
    assert curve(sched_cfg("cosine", W), T) == pytest.approx(cosine, abs=1e-12, rel=0)


class NoPrecision:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


CFG = sched_cfg("wsd", warmup=2, fraction=0.25, decay_type="linear", min_lr_ratio=0.1)


def make(max_steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, build_scheduler(opt, CFG, max_steps)


def train(model, opt, sched, steps):
    lrs = []
    for k in steps:
        g = torch.Generator().manual_seed(k)
        x = torch.randn(4, 8, generator=g)
        model(x).square().mean().backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        opt.zero_grad()
        sched.step()
    return lrs


def resumed(tmp_path, stop, max_steps_before, max_steps_after):
    """Train to `stop` under one max_steps, save, load into a fresh run with another, train to its end."""
    model, opt, sched = make(max_steps_before)
    before = train(model, opt, sched, range(stop))
    dcp_state.save(str(tmp_path / "ckpt"), model, opt, sched, NoPrecision())
    model, opt, sched = make(max_steps_after)
    dcp_state.load(str(tmp_path / "ckpt"), model, opt, sched, NoPrecision())
    return model, before + train(model, opt, sched, range(stop, max_steps_after))


def uninterrupted(max_steps):
    model, opt, sched = make(max_steps)
    return model, train(model, opt, sched, range(max_steps))


def same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("stop", [14, 15, 16, 18])   # the decay of 20 steps starts at step 15
def test_resume_is_exact_across_the_decay_start(tmp_path, stop):
    ref_model, ref_lrs = uninterrupted(20)
    model, lrs = resumed(tmp_path, stop, 20, 20)
    assert lrs == ref_lrs and same_params(model, ref_model)


def test_a_run_extended_from_its_stable_phase_equals_the_longer_run(tmp_path, capfd):
    ref_model, ref_lrs = uninterrupted(40)
    model, lrs = resumed(tmp_path, 12, 20, 40)
    assert lrs == ref_lrs and same_params(model, ref_model)
    assert "warning" not in capfd.readouterr().err


def test_a_run_extended_from_inside_its_decay_follows_the_new_schedule_and_says_so(tmp_path, capfd):
    model, lrs = resumed(tmp_path, 18, 20, 40)
    assert lrs[18:] == [1e-2 * m for m in hand_curve(40, 2, 0.25, "linear", 0.1)[18:]]
    err = capfd.readouterr().err
    assert err.count("warning: trainer.max_steps: the checkpoint (step 18) is inside the decay that began at "
                     "step 15 of 20") == 1, err


def test_the_saved_schedule_state_is_the_step_not_the_learning_rates():
    model, opt, sched = make(20)
    train(model, opt, sched, range(3))
    assert sched.state_dict() == {"last_epoch": 3, "max_steps": 20, "decay_start": 15}
