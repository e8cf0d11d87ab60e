"""optimizer=adamw_bf16 with precision.store_dtype=bfloat16, trained by parallel=single's own strategy in this process,
equals torchao's `_AdamW(bf16_stochastic_round=True)` used directly on the fp32-initialised model cast to bf16 (every
loss and every parameter, bitwise); its states are bf16 and the planner counts them as measured.

Stochastic rounding draws from torch's global generator (torchao's compiled step takes its seed from it): both sides
seed it alike before each step, and a third run seeded otherwise shows the rounding is random indeed. torchao compiles
its step once per parameter shape (tens of seconds cold): the runs share one process and its compiled kernels."""
from __future__ import annotations

import pytest
import torch

from framework.metrics.memory import local_bytes
from framework.models.factory import ModelFactory
from framework.models.loss import cross_entropy
from framework.optim.factory import OptimizerFactory
from framework.optim.schedulers import build_scheduler
from framework.plan.model_states import OptimizerKind
from framework.strategies.single import SingleDeviceStrategy

torchao_optim = pytest.importorskip("torchao.optim")

STEPS, VOCAB = 4, 256
TINY = ["model=tiny", "data.seq_len=32", "scheduler=constant", "scheduler.warmup_steps=0", "trainer.grad_clip=0"]
MODE = ["precision=bf16", "precision.store_dtype=bfloat16", "optimizer=adamw_bf16"]


def batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (4, 17), generator=g) for _ in range(STEPS)]


def framework_run(cfg, seed: int = 100):
    """The job's strategy: its model (built and cast by the factory), optimizer, schedule and step."""
    strategy = SingleDeviceStrategy(cfg)
    factory = ModelFactory(cfg)
    strategy.setup(factory, OptimizerFactory(cfg.optimizer, factory.spec.output_heads()),
                   lambda opt: build_scheduler(opt, cfg.scheduler, STEPS))
    initial = [p.detach().clone() for p in strategy.model.parameters()]
    losses = []
    for k, tokens in enumerate(batches()):
        losses.append(strategy.forward_backward([(tokens[:, :-1], tokens[:, 1:])], cross_entropy).item())
        torch.manual_seed(seed + k)
        strategy.optimizer_step(cfg.trainer.grad_clip)
    return strategy.model, strategy.optimizer, losses, initial


def torchao_run(model, o):
    """torchao's optimizer on the model as given: decay on the matrices, none on the rest (the framework's two
    groups, matrices first)."""
    params = list(model.parameters())
    opt = torchao_optim._AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
                                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                               lr=o.lr, betas=tuple(o.betas), eps=o.eps, bf16_stochastic_round=True)
    losses = []
    for k, tokens in enumerate(batches()):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
        torch.manual_seed(100 + k)
        opt.step()
        opt.zero_grad()
    return losses


@pytest.fixture(scope="module")
def runs(compose_config):
    torch.set_num_threads(1)        # the same bf16 matmul blocking on both sides
    cfg = compose_config([*TINY, *MODE])
    model, optimizer, losses, initial = framework_run(cfg)
    reference = ModelFactory(compose_config(TINY))().to(torch.bfloat16)      # the fp32 init, rounded here
    cast = [p.detach().clone() for p in reference.parameters()]
    reference_losses = torchao_run(reference, cfg.optimizer)
    other_seed, *_ = framework_run(cfg, seed=200)
    return dict(cfg=cfg, model=model, optimizer=optimizer, losses=losses, initial=initial, reference=reference,
                reference_losses=reference_losses, cast=cast, other_seed=other_seed)


def test_single_equals_torchao_adamw_on_the_bf16_cast_model(runs):
    assert "_AdamW" in torchao_optim.__all__        # conf/optimizer/adamw_bf16.yaml names it so
    assert type(runs["optimizer"]) is torchao_optim._AdamW and runs["optimizer"].bf16_stochastic_round
    assert all(p.dtype == torch.bfloat16 for p in runs["initial"])
    assert all(torch.equal(p, q) for p, q in zip(runs["initial"], runs["cast"]))     # the fp32 init, rounded
    assert runs["losses"] == runs["reference_losses"]
    for (name, p), q in zip(runs["model"].named_parameters(), runs["reference"].parameters()):
        assert p.dtype == torch.bfloat16 and p.grad is None
        assert torch.equal(p, q), name


def test_the_rounding_is_stochastic(runs):
    """Seeded otherwise, the same gradients round to other bf16 values somewhere: the rounding draws."""
    moved = [not torch.equal(p, q) for p, q in zip(runs["model"].parameters(), runs["other_seed"].parameters())]
    assert any(moved)


def test_the_planned_state_bytes_are_the_measured(runs):
    kind = OptimizerKind.of(runs["cfg"].optimizer)
    for name, p in runs["model"].named_parameters():
        state = runs["optimizer"].state[p]
        assert {t.dtype for k, t in state.items() if k != "step"} == {torch.bfloat16}, name
        assert kind.bytes_for(p.numel(), p.element_size()) == sum(local_bytes(t) for t in state.values()), name
