"""The precomputed reference's file (framework/train/reference_table.py) as a worker reads it back: the log-probs
as written (a split it lacks left out, for the pass to score), and a refusal naming the file for one that is cut
short, damaged past its manifest's checks (a change after the launching process looked), of another pair count,
or computed for other prepared pairs."""
import numpy as np
import pytest
import torch

from framework.checkpoint.names import ResumeRefused
from framework.data.examples import Pairs
from framework.train.reference_table import data_fingerprint, decode, encode

WHERE = "s3://bucket/run/step_00000002/reference_logps.safetensors"


def _pairs(seq_len=16, tokens=None):
    """Three pairs: a 4-token prompt, then completions of 3..8 tokens (the mask marks them)."""
    lengths = [7, 9, 8, 12, 10, 11]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.arange(starts[-1]) % 50 + 1 if tokens is None else tokens
    mask = np.ones(starts[-1], dtype=np.uint8)
    for s in starts[:-1]:
        mask[s:s + 4] = 0
    return Pairs(tokens, mask, starts, seq_len)


def _tables():
    g = torch.Generator().manual_seed(0)
    return {"train": -100 * torch.rand(3, 2, generator=g), "val": -100 * torch.rand(1, 2, generator=g)}


def _file(tables=None):
    tables = tables or _tables()
    prints = {split: f"fp-{split}" for split in tables}
    expected = {split: (len(t), prints[split]) for split, t in tables.items()}
    return encode(tables, prints), expected


def test_the_log_probs_come_back_as_written():
    tables = _tables()
    data, expected = _file(tables)
    found = decode(data, WHERE, expected)
    assert list(found) == ["train", "val"] and all(torch.equal(found[k], tables[k]) for k in tables)
    assert list(decode(data, WHERE, {"train": expected["train"]})) == ["train"]     # no evaluation: no val read


def test_a_damaged_table_is_refused():
    data, expected = _file()
    flipped = bytearray(data)
    flipped[-3] ^= 0x40                     # inside the last log-prob: still a well-formed file
    with pytest.raises(ResumeRefused, match=f"refusing {WHERE}: damaged \\(its log-probs differ from the SHA-256"):
        decode(bytes(flipped), WHERE, expected)
    for cut in (data[:len(data) // 2], data[:5], b""):
        with pytest.raises(ResumeRefused, match=f"refusing {WHERE}: not a table of reference log-probs"):
            decode(cut, WHERE, expected)


def test_a_table_for_other_data_is_refused():
    data, expected = _file()
    with pytest.raises(ResumeRefused, match="it holds the reference log-probs of 3 train pairs, the data has 4 now"):
        decode(data, WHERE, {**expected, "train": (4, expected["train"][1])})
    with pytest.raises(ResumeRefused, match="its val log-probs were computed for other pairs"):
        decode(data, WHERE, {**expected, "val": (1, "fp-other")})


def test_a_split_the_table_lacks_is_left_to_score():
    """Evaluation switched on for the resumed run: the validation pairs were never scored."""
    _, expected = _file()
    train_only = encode({"train": _tables()["train"]}, {"train": "fp-train"})
    assert list(decode(train_only, WHERE, expected)) == ["train"]


def test_the_fingerprint_follows_what_the_pairs_hold():
    assert data_fingerprint(_pairs()) == data_fingerprint(_pairs())
    other = np.arange(57) % 50 + 1
    other[20] += 1                          # one completion token of the second pair
    assert data_fingerprint(_pairs(tokens=other)) != data_fingerprint(_pairs())
    assert data_fingerprint(_pairs(seq_len=8)) != data_fingerprint(_pairs())      # truncated differently
