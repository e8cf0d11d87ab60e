"""The MoE family in one process: dispatch against a per-token reference, grouped GEMM against the loop,
parameter counts against the built model, balancing (auxiliary loss weight, global-batch fractions, bias
rule), activation checkpointing in every mode with every balance, config refusals."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from omegaconf import OmegaConf

from framework.config.schema import ActivationCheckpointingConfig
from framework.models.llama.model import init_parameter
from framework.models.loss import cross_entropy, weighted_micro_batch
from framework.models.moe import balance
from framework.models.moe.experts import expert_swiglu, has_grouped_mm
from framework.models.moe.model import MoETransformer
from framework.models.moe.spec import SPEC
from framework.parallel.activation_checkpointing import apply_activation_checkpointing
from framework.parallel.expert_parallel import apply_expert_parallel
from tests.harness.helpers import REPO

TINY = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, n_experts=4, top_k=2, moe_ffn_dim=16)


def build(**overrides) -> MoETransformer:
    model = MoETransformer(**{**TINY, **overrides})
    for name, p in model.named_parameters():
        init_parameter(p, name, seed=0, n_layers=model.args.n_layers)
    return model


def test_dispatch_equals_a_per_token_reference():
    """Sorted, dropless dispatch gives every token the weighted sum of its own top-k experts (+ shared)."""
    model = build(shared_ffn_dim=8)
    ffn = model.layers["0"].feed_forward
    x = torch.randn(3, 5, 32)
    got = ffn(x)
    flat = x.reshape(-1, 32)
    scores = F.linear(flat, ffn.router.gate.weight).softmax(-1)
    w, ids = scores.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    ex = ffn.experts
    want = torch.stack([
        sum(w[t, j] * F.linear(F.silu(F.linear(flat[t], ex.w1[e])) * F.linear(flat[t], ex.w3[e]), ex.w2[e])
            for j, e in enumerate(ids[t].tolist())) + ffn.shared_expert(flat[t])
        for t in range(flat.shape[0])])
    torch.testing.assert_close(got.reshape(-1, 32), want, atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not has_grouped_mm(), reason="this torch has no torch._grouped_mm")
def test_grouped_gemm_equals_the_loop_forward_and_backward():
    torch.manual_seed(0)
    counts = torch.tensor([3, 0, 5, 2])          # an expert without tokens included
    x = torch.randn(10, 8, requires_grad=True)
    weights = [torch.randn(4, 12, 8, requires_grad=True), torch.randn(4, 12, 8, requires_grad=True),
               torch.randn(4, 8, 12, requires_grad=True)]
    grads = []
    for compute in ("grouped_mm", "loop"):
        out = expert_swiglu(x, counts, *weights, compute=compute)
        out.sum().backward()                     # a stride-0 gradient, which grouped_mm's backward refuses
        grads.append((out.detach(), x.grad.clone(), *(w.grad.clone() for w in weights)))
        for t in (x, *weights):
            t.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.fixture
def one_rank_mesh():
    """A one-rank gloo group in this process, for the expert-parallel dispatcher (its all-to-alls)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_compiled_moe_layers_compile_once_whatever_the_layer_and_the_routing(expert_parallel, request):
    """The experts and the dispatcher split rows by counts the router decides, and the balance bookkeeping
    indexes by layer and counts forwards: traced into a block's graph, dynamo would specialize on them and
    recompile for every new routing, layer and micro-batch (until its cache limit, after which it runs eagerly).
    They run eagerly between the compiled parts instead, with the same numbers: the graphs of the first layer's
    first forward serve every later layer and batch."""
    import torch._dynamo
    model = build()
    if expert_parallel:
        apply_expert_parallel(model, request.getfixturevalue("one_rank_mesh"))
    torch._dynamo.reset()
    layers = [(ffn, torch.compile(ffn, backend="aot_eager"))
              for ffn in (model.layers[i].feed_forward for i in ("0", "1"))]
    graphs = []
    for seed in range(4):                  # four batches, four routings
        for ffn, compiled in layers:
            x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            got = compiled(x)
            got.sum().backward()
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
            torch.testing.assert_close(got, ffn(x), atol=1e-6, rtol=1e-5)
    assert graphs == graphs[:1] * len(graphs), f"graphs compiled after each layer's forward: {graphs}"


def test_parameter_counts_come_from_shapes():
    """num_params (used by MFU and the planner) equals the built model's; active counts k of E experts."""
    for name in ("moe_tiny", "mixtral_8x7b", "qwen3_30b_a3b"):
        cfg = OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")
        cfg.pop("defaults")
        with torch.device("meta"):
            model = SPEC.build(cfg)
        args = SPEC.args(cfg)
        assert SPEC.num_params(cfg) == sum(p.numel() for p in model.parameters()), name
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        assert SPEC.active_params(cfg) == SPEC.num_params(cfg) - experts * (args.n_experts - args.top_k) // args.n_experts
        assert SPEC.flops_per_token(cfg, 1) < 6 * SPEC.num_params(cfg)


def _aux_grad(weight: float) -> torch.Tensor:
    model = build(balance="aux_loss", aux_loss_coef=1.0)
    model.train()
    with weighted_micro_batch(weight):
        logits = model(torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0)))
    (logits.sum() * 0).backward()                # only the auxiliary loss reaches the router
    return model.layers["0"].feed_forward.router.gate.weight.grad


def test_auxiliary_loss_gradient_is_weighted_like_the_micro_batch_loss():
    full, half = _aux_grad(1.0), _aux_grad(0.5)
    assert full.abs().sum() > 0
    torch.testing.assert_close(half, full / 2)


BATCH = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(3))


def _step(model, micro_batch: int, lm_loss: bool = True) -> tuple[float, dict, dict]:
    """One training step as a strategy runs it on one process (the statistics pass where the spec asks for
    one and the batch is split, micro-batch losses weighted 1/n), then an optimizer step that moves nothing:
    (loss, gradients, balance.last_step())."""
    model.train()
    parts = BATCH.split(micro_batch)
    stats = SPEC.batch_statistics(OmegaConf.create({**TINY, **_args(model)}))
    if stats is not None and len(parts) > 1:
        with stats.gathering(torch.device("cpu")), torch.no_grad():
            model.eval()
            for x in parts:
                model(x)
            model.train()
    total = 0.0
    for x in parts:
        with weighted_micro_batch(1 / len(parts)):
            out = model(x)
            loss = cross_entropy(out[:, :-1], x[:, 1:]) if lm_loss else out.sum() * 0
            (loss / len(parts)).backward()
        total += float(loss.detach()) / len(parts)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.optim.SGD(model.parameters(), lr=0.0).step()
    return total, grads, balance.last_step()


def _args(model) -> dict:
    a = model.args
    return {k: getattr(a, k) for k in ("balance", "aux_loss_coef", "n_layers", "n_experts", "top_k")}


def test_balance_loss_counts_the_global_batch_whatever_the_micro_batch():
    """The auxiliary loss's value and gradient from 4 micro-batches of 2 (with the statistics pass) equal
    those of one forward of all 8 sequences; per-micro-batch fractions would not (their mean of products
    is not the product of means)."""
    whole = _step(build(balance="aux_loss", aux_loss_coef=1.0), 8, lm_loss=False)
    split = _step(build(balance="aux_loss", aux_loss_coef=1.0), 2, lm_loss=False)
    assert whole[2]["aux_loss"] == pytest.approx(split[2]["aux_loss"], rel=1e-6)
    assert torch.equal(whole[2]["shares"], split[2]["shares"])
    gate = "layers.0.feed_forward.router.gate.weight"
    assert whole[1][gate].abs().sum() > 0
    for name, g in whole[1].items():
        torch.testing.assert_close(split[1][name], g, atol=1e-7, rtol=1e-6)


AC_MODES = {"full": dict(mode="full"), "layer_save_matmuls": dict(mode="layer", save_matmuls=True),
            "op": dict(mode="op"), "op_every_other_matmul": dict(mode="op", save_every_nth_matmul=2)}


@pytest.mark.parametrize("balance_mode, micro_batch", [("aux_loss", 4), ("bias", 4), ("none", 8)])
def test_checkpointing_in_every_mode_changes_nothing(balance_mode, micro_batch):
    """Every checkpointing mode gives the un-checkpointed loss, gradients and expert loads (tallied once a
    training forward, not again in the recompute; aux_loss over two micro-batches runs the statistics pass)."""
    want = _step(build(balance=balance_mode), micro_batch)
    for name, kwargs in AC_MODES.items():
        model = build(balance=balance_mode)
        apply_activation_checkpointing(model, OmegaConf.structured(ActivationCheckpointingConfig(**kwargs)),
                                       model.block_classes())
        loss, grads, last = _step(model, micro_batch)
        assert abs(loss - want[0]) <= 1e-6 * want[0], (name, micro_batch)
        assert grads.keys() == want[1].keys()
        for key, g in want[1].items():
            torch.testing.assert_close(grads[key], g, atol=1e-7, rtol=1e-6, msg=f"{name} {key}")
        assert torch.equal(last["shares"], want[2]["shares"]) and last["aux_loss"] == want[2]["aux_loss"], name


def test_bias_balance_moves_toward_the_less_loaded_experts():
    model = build(balance="bias", bias_update_rate=0.1)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model(torch.randint(0, 64, (4, 16))).sum().backward()
    opt.step()
    shares = balance.last_step()["shares"][0]
    bias = model.layers["0"].feed_forward.router.expert_bias.detach()
    torch.testing.assert_close(bias.double(), 0.1 * torch.sign(shares.mean() - shares), atol=1e-7, rtol=0)
    assert bias.abs().sum() > 0


def test_sigmoid_scores_and_bias_pick_other_experts_but_keep_their_weights():
    model = build(score_func="sigmoid", balance="bias")
    router = model.layers["0"].feed_forward.router
    x = torch.randn(6, 32)
    _, weights, ids = router(x)
    with torch.no_grad():
        router.expert_bias.copy_(torch.tensor([10.0, 10.0, 0.0, 0.0]))
    scores, weights_b, ids_b = router(x)
    assert sorted(ids_b[0].tolist()) == [0, 1]
    chosen = scores.gather(-1, ids_b)
    torch.testing.assert_close(weights_b, chosen / chosen.sum(-1, keepdim=True))


@pytest.mark.parametrize("args, key, fragment", [
    (["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=2", "parallel.ep=2", "model=tiny"],
     "parallel.ep", "has no experts"),
    (["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=4", "parallel.ep=2", "model=moe_tiny"],
     "parallel.ep", "use parallel.ep=4"),
    (["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=8", "parallel.ep=8", "model=moe_tiny",
      "trainer.micro_batch_size=1"],
     "parallel.ep", "do not divide"),
    (["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1", "parallel.sequence_parallel=true",
      "model=moe_tiny"], "parallel.sequence_parallel", "every token"),
    (["parallel=ddp", "parallel.ep=2", "model=moe_tiny"], "parallel.ep", "parallel=3d does"),
    (["model=moe_tiny", "model.top_k=5"], "model.top_k", "between 1 and"),
    (["model=moe_tiny", "model.score_func=tanh"], "model.score_func", "softmax, sigmoid"),
])
def test_bad_moe_settings_are_refused_before_work(compose_config, args, key, fragment):
    from tests.harness.helpers import derive_and_validate
    from framework.errors import ConfigError
    from framework.runtime import world
    from framework.strategies.registry import strategy_class
    from tests.harness.helpers import FAST
    cfg = compose_config([*FAST, *args])
    cls = strategy_class(cfg.parallel.name)
    with pytest.raises(ConfigError) as e:
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
    assert e.value.key == key and fragment in str(e.value), str(e.value)
