"""Context parallelism's math on one process: load-balanced shards, their positions and inverse, and
attention/loss over simulated cp ranks equal to the unsplit sequence (fp32, 1e-6)."""
import pytest
import torch
import torch.nn.functional as F

from framework.models.gpt2.model import GPT2, init_parameter as gpt2_init_parameter
from framework.models.llama import Llama, init_weights as llama_init
from framework.models.loss import cross_entropy
from framework.models.positions import holding
from framework.parallel.context_parallel import (GatheredAttention, chunked_causal_attention, gathered_positions,
                                                 shard, shard_positions, unshard)

CP = (1, 2, 4)


@pytest.mark.parametrize("cp", CP)
def test_ranks_hold_opposite_chunks_of_equal_causal_work(cp):
    seq = 8 * cp
    held = [shard_positions(seq, cp, r) for r in range(cp)]
    assert sorted(torch.cat(held).tolist()) == list(range(seq))
    chunk = seq // (2 * cp)
    for r, pos in enumerate(held):
        assert pos[:chunk].tolist() == list(range(r * chunk, (r + 1) * chunk))
        assert pos[chunk:].tolist() == list(range((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk))
    # (query, key) pairs under the causal mask: the same on every rank
    work = {int((pos[:, None] >= torch.arange(seq)[None, :]).sum()) for pos in held}
    assert len(work) == 1


@pytest.mark.parametrize("cp", CP)
def test_unshard_inverts_shard(cp):
    x = torch.randn(2, 16 * cp, 3)
    parts = [shard(x, cp, r) for r in range(cp)]
    assert all(p.shape == (2, 16, 3) for p in parts)
    assert torch.equal(unshard(parts), x)


@pytest.mark.parametrize("cp", (2, 4))
def test_per_rank_attention_equals_unsplit_forward_and_backward(cp):
    torch.manual_seed(0)
    seq = 8 * cp
    q, k, v = (torch.randn(2, 4, seq, 8, requires_grad=True) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # each rank: its own queries over every rank's keys/values, gathered in rank order and put back in order
    k_all, v_all = (unshard([shard(t, cp, r, dim=2) for r in range(cp)], dim=2) for t in (k, v))
    outs = [chunked_causal_attention(shard(q, cp, r, dim=2), k_all, v_all, shard_positions(seq, cp, r),
                                     seq // (2 * cp)) for r in range(cp)]
    split = unshard(outs, dim=2)
    torch.testing.assert_close(split, full, atol=1e-6, rtol=0)
    weights = torch.randn_like(full)
    grads_full = torch.autograd.grad((full * weights).sum(), (q, k, v))
    grads_split = torch.autograd.grad((split * weights).sum(), (q, k, v))
    for a, b in zip(grads_split, grads_full):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def _llama():
    model = Llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64)
    llama_init(model, seed=0)
    return model


def _gpt2():
    model = GPT2(dim=32, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=64)
    for name, p in model.named_parameters():
        gpt2_init_parameter(p, name, seed=0, n_layers=2)
    return model


@pytest.mark.parametrize("build", (_llama, _gpt2), ids=("llama_rope", "gpt2_learned"))
@pytest.mark.parametrize("cp", (2, 4))
def test_model_over_simulated_ranks_equals_unsplit_logits_and_loss(build, cp):
    """The rank-ordered concatenation of every rank's shard, run with the shard positions held and keys
    masked by global position, gives the unsplit logits (un-permuted) and the unsplit loss."""
    model, seq = build(), 8 * cp
    tokens, labels = torch.randint(0, 64, (2, seq)), torch.randint(0, 64, (2, seq))
    full = model(tokens)
    all_positions = gathered_positions(seq, cp)
    joined = torch.cat([shard(tokens, cp, r) for r in range(cp)], dim=1)
    with holding(all_positions), GatheredAttention(lambda t: t, all_positions, all_positions, seq // (2 * cp)):
        logits = model(joined)
    per_rank = list(logits.chunk(cp, dim=1))
    torch.testing.assert_close(unshard(per_rank), full, atol=1e-6, rtol=0)
    rank_losses = [cross_entropy(out, shard(labels, cp, r)) for r, out in enumerate(per_rank)]
    torch.testing.assert_close(torch.stack(rank_losses).mean(), cross_entropy(full, labels), atol=1e-6, rtol=0)


def test_positions_are_plain_outside_a_shard():
    model = _llama()
    tokens = torch.randint(0, 64, (1, 12))
    shuffled = torch.randperm(12)
    with holding(shuffled), GatheredAttention(lambda t: t, shuffled, shuffled, chunk=1):
        permuted = model(tokens[:, shuffled])
    torch.testing.assert_close(permuted, model(tokens)[:, shuffled], atol=1e-6, rtol=0)


def test_rope_rows_are_gathered_once_per_forward_under_a_shard():
    """Under cp every layer of a forward reads the same gathered cos/sin rows (one tensor autograd saves,
    not one per layer); a new forward's tables get their own; a plain forward reads views of its tables."""
    from framework.models import positions
    gathers = []
    rows_of = positions._Held.rows_of

    def counted(self, table, seq_len):
        rows = rows_of(self, table, seq_len)
        gathers.append(rows)
        return rows
    model, seq = _llama(), 8
    held = shard_positions(2 * seq, 2, 1)
    with holding(held), pytest.MonkeyPatch.context() as patch:
        patch.setattr(positions._Held, "rows_of", counted)
        model(torch.randint(0, 64, (2, seq)))
        first = {id(t) for t in gathers}
        assert len(gathers) == 2 * model.args.n_layers and len(first) == 2     # cos and sin, once each
        gathers.clear()
        model(torch.randint(0, 64, (2, seq)))
        assert len({id(t) for t in gathers}) == 2
    table = torch.arange(40.0).view(20, 2)
    with holding(held):
        rows = positions.position_rows(table, seq)
        assert positions.position_rows(table, seq) is rows
        torch.testing.assert_close(rows, table[held])
    plain = positions.position_rows(table, seq)
    assert plain.untyped_storage().data_ptr() == table.untyped_storage().data_ptr() and plain.shape == (seq, 2)
