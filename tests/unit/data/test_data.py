"""Layout-independent batches and the data sources."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from framework.data.batches import GlobalBatchSampler, micro_batches, split_train_val
from framework.data.sources import DataError, check_token_range, load_tokens, pydoc_corpus_bytes


def _cfg(**kw):
    base = dict(source="pydoc", path=None, dtype="uint16", vocab_size=256, num_tokens=1000)
    return OmegaConf.create({**base, **kw})


def test_pydoc_corpus_is_real_text():
    raw = pydoc_corpus_bytes()
    assert len(raw) > 100_000
    assert b"for" in raw and b"class" in raw


@pytest.mark.parametrize("dp_size", [2, 4, 8])
def test_global_batch_is_identical_whatever_the_dp_degree(dp_size):
    tokens = np.arange(10_000) % 251
    sampler = GlobalBatchSampler(tokens, seq_len=16, global_batch_size=8, seed=3)
    for step in (0, 1, 77):   # 77 wraps past the first epoch (624 sequences / 8 per step)
        whole = sampler.local_batch(step, 0, 1)
        parts = torch.cat([sampler.local_batch(step, r, dp_size) for r in range(dp_size)])
        assert torch.equal(whole, parts)


def test_steps_differ_epochs_reshuffle_and_seed_matters():
    tokens = np.arange(16 * 200 + 1)   # 200 sequences, 50 steps per epoch
    a = GlobalBatchSampler(tokens, 16, 4, seed=0)
    b = GlobalBatchSampler(tokens, 16, 4, seed=1)
    assert not torch.equal(a.local_batch(0, 0, 1), a.local_batch(1, 0, 1))
    assert not torch.equal(a.local_batch(0, 0, 1), b.local_batch(0, 0, 1))
    assert a.num_sequences % 4 == 0
    per_epoch = a.num_sequences // 4
    assert not np.array_equal(a.sequence_ids(0), a.sequence_ids(per_epoch))   # epoch 1 is another order


def test_every_sequence_is_visited_once_per_epoch():
    sampler = GlobalBatchSampler(np.arange(1_601), seq_len=16, global_batch_size=10, seed=5)
    seen = np.concatenate([sampler.sequence_ids(s) for s in range(10)])
    assert sorted(seen) == list(range(100))


def test_targets_are_inputs_shifted_by_one():
    sampler = GlobalBatchSampler(np.arange(1_000), 8, 4, seed=0, shuffle=False)
    (x, y), = micro_batches(sampler.local_batch(0, 0, 1), 4)
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (4, 8)


def test_split_is_disjoint_and_complete():
    tokens = np.arange(1000)
    train, val = split_train_val(tokens, 0.1)
    assert len(train) == 900 and len(val) == 100 and train[-1] + 1 == val[0]


def test_token_file_is_memory_mapped(tmp_path):
    path = tmp_path / "tokens.bin"
    ids = np.array([1, 2, 40000, 3], dtype=np.uint16)
    ids.tofile(path)
    tokens = load_tokens(_cfg(source="tokens", path=str(path)))
    assert isinstance(tokens, np.memmap) and list(tokens) == [1, 2, 40000, 3]
    with pytest.raises(DataError, match="data.vocab_size"):
        check_token_range(tokens, 1000, str(path))


def test_token_file_of_odd_size_is_refused(tmp_path):
    path = tmp_path / "tokens.bin"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        load_tokens(_cfg(source="tokens", path=str(path)))


def test_text_file_is_byte_tokenized(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("héllo")
    assert list(load_tokens(_cfg(source="text", path=str(path)))) == list("héllo".encode())


def test_synthetic_tokens_are_deterministic_and_in_range():
    a, b = load_tokens(_cfg(source="synthetic", vocab_size=50)), load_tokens(_cfg(source="synthetic", vocab_size=50))
    assert np.array_equal(a, b) and a.max() < 50 and len(a) == 1000
