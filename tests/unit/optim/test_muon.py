"""optimizer=muon in one process equals torch's own optimizers used directly: torch.optim.Muon on the hidden matrices,
torch.optim.AdamW on the embeddings, the output head, norms and biases (bitwise). The split is written out here by
name, not asked of the framework. Also optimizer.groups by name pattern, against torch's optimizers given the same
groups by hand."""
from __future__ import annotations

import torch

from framework.models.factory import ModelFactory
from framework.optim.factory import OptimizerFactory

TINY = ["model=tiny", "data.seq_len=32"]


def model_and_factory(compose_config, *overrides):
    cfg = compose_config([*TINY, *overrides])
    factory = ModelFactory(cfg)
    return cfg, factory(), OptimizerFactory(cfg.optimizer, factory.spec.output_heads())


def train(model, optimizers, steps=4, vocab=256):
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (4, 17), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
    return losses


def reference_optimizers(model, o):
    """torch.optim.Muon on the blocks' matrices, torch.optim.AdamW on the rest, chosen here by name."""
    named = dict(model.named_parameters())
    hidden = [p for n, p in named.items() if n.startswith("layers.") and p.ndim == 2]
    head_embed = [named["tok_embeddings.weight"], named["output.weight"]]
    rest = [p for n, p in named.items() if p.ndim == 1]
    assert len(hidden) + len(head_embed) + len(rest) == len(named) and len(hidden) == 2 * 7
    return [torch.optim.Muon(hidden, lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum,
                             nesterov=o.nesterov, ns_steps=o.ns_steps),
            torch.optim.AdamW([{"params": head_embed, "weight_decay": o.weight_decay},
                               {"params": rest, "weight_decay": 0.0}],
                              lr=o.adamw_lr, betas=tuple(o.adamw_betas), eps=o.adamw_eps)]


def test_muon_equals_torch_muon_and_adamw(compose_config):
    torch.set_num_threads(1)        # the same bf16 matmul blocking on both sides
    cfg, model, build = model_and_factory(compose_config, "optimizer=muon")
    _, ref_model, _ = model_and_factory(compose_config, "optimizer=muon")
    named = dict(ref_model.named_parameters())
    reference = reference_optimizers(ref_model, cfg.optimizer)
    optimizer = build(model)
    assert train(model, [optimizer]) == train(ref_model, reference)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert torch.equal(p, q), name
    # the state the checkpoint saves: one momentum buffer per Muon matrix, Adam's moments for the rest
    assert all(set(optimizer.state[p]) == {"momentum_buffer"} for p in
               [dict(model.named_parameters())[n] for n in named if n.startswith("layers.") and named[n].ndim == 2])


def test_round_robin_on_one_process_is_gather(compose_config):
    torch.set_num_threads(1)
    _, a, build_a = model_and_factory(compose_config, "optimizer=muon")
    _, b, build_b = model_and_factory(compose_config, "optimizer=muon", "optimizer.mode=round_robin")
    train(a, [build_a(a)], steps=2)
    train(b, [build_b(b)], steps=2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_groups_by_pattern_equal_torch_given_the_same_groups(compose_config):
    _, model, build = model_and_factory(
        compose_config, "optimizer=adamw",
        "+optimizer.groups=[{pattern: 'output',lr_scale: 0.5,weight_decay: 0.0},{pattern: 'norm',lr_scale: 2.0}]")
    _, ref_model, _ = model_and_factory(compose_config, "optimizer=adamw")
    named = dict(ref_model.named_parameters())
    lr = 3e-3
    groups = [{"params": [named["output.weight"]], "lr": lr * 0.5, "weight_decay": 0.0},
              {"params": [p for n, p in named.items() if "norm" in n], "lr": lr * 2.0, "weight_decay": 0.0},
              {"params": [p for n, p in named.items() if p.ndim == 2 and n != "output.weight"], "weight_decay": 0.1}]
    reference = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)
    optimizer = build(model)
    built = {frozenset(id(p) for p in g["params"]): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups}
    ids = {n: id(p) for n, p in model.named_parameters()}
    assert built[frozenset([ids["output.weight"]])] == (lr * 0.5, 0.0)
    assert train(model, [optimizer]) == train(ref_model, [reference])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref_model.parameters()))


def test_a_pattern_can_send_a_matrix_to_adamw_under_muon(compose_config):
    _, model, build = model_and_factory(compose_config, "optimizer=muon",
                                        "+optimizer.groups=[{pattern: 'feed_forward',algorithm: adamw}]")
    optimizer = build(model)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in optimizer.param_groups if g["algorithm"] == "muon" for p in g["params"]}
    assert muon == {n for n, p in model.named_parameters()
                    if n.startswith("layers.") and p.ndim == 2 and "feed_forward" not in n}
