"""The Llama model: shapes, attention variants, parameter count and layout-independent init."""
import torch

from framework.models.llama import Llama, LlamaArgs, init_weights

TINY = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64)


def _model(**kw):
    model = Llama(**{**TINY, **kw})
    init_weights(model, seed=0)
    return model


def test_logits_shape_and_causality():
    model = _model()
    tokens = torch.randint(0, 64, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, 64)
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 64
    # positions before the change cannot see it
    assert torch.allclose(model(changed)[:, :7], logits[:, :7])
    assert not torch.allclose(model(changed)[:, 7:], logits[:, 7:])


def test_grouped_query_attention_has_fewer_kv_weights():
    model = _model()
    attn = model.layers["0"].attention
    assert attn.wk.weight.shape == (2 * 8, 32) and attn.wq.weight.shape == (32, 32)


def test_parameter_count_from_shapes_matches_the_module():
    for kw in ({}, {"tie_embeddings": True}, {"n_kv_heads": None, "ffn_dim": 48}):
        model = _model(**kw)
        assert LlamaArgs(**{**TINY, **kw}).num_params() == sum(p.numel() for p in model.parameters())


def test_tied_embeddings_share_one_tensor():
    model = _model(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight


def test_init_depends_on_seed_and_name_only():
    a, b = _model(), _model()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    # a partial model (as a pipeline stage builds it) gets the same values for the names it keeps
    part = Llama(**TINY)
    del part.layers["0"]
    part.tok_embeddings = None
    init_weights(part, seed=0)
    full = dict(a.named_parameters())
    assert all(torch.equal(p, full[name]) for name, p in part.named_parameters())
    c = Llama(**TINY)
    init_weights(c, seed=1)
    assert not torch.equal(c.layers["0"].attention.wq.weight, a.layers["0"].attention.wq.weight)


def test_flops_per_token_counts_attention():
    args = LlamaArgs(**TINY)
    model = Llama(**TINY)
    short, long = model.flops_per_token(8), model.flops_per_token(16)
    assert long - short == 12 * args.n_layers * args.n_heads * args.head_dim * 8
