"""Megatron-LM indexed datasets: our reader against files megatron-core's own builder wrote, and
training through data=megatron equals training on the same tokens through data=tokens."""
import numpy as np
import pytest

from framework.data import megatron
from framework.data.prepare import prepare
from framework.data.token_dataset import open_tokens
from tests.fixtures.corpora import write_pydoc_jsonl
from tests.harness.helpers import FAST, check_ok, losses, run_framework

indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")


def _build(prefix, documents, dtype):
    builder = indexed_dataset.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        builder.add_document(np.asarray(doc), [len(doc)])
    builder.finalize(f"{prefix}.idx")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_reader_matches_megatron_core(tmp_path, dtype):
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 60_000, size=rng.integers(1, 50)).tolist() for _ in range(40)]
    _build(tmp_path / "corpus", documents, dtype)
    ours = megatron.open_tokens(str(tmp_path / "corpus"))
    theirs = indexed_dataset.IndexedDataset(str(tmp_path / "corpus"))
    assert ours.dtype == dtype and megatron.read_index(str(tmp_path / "corpus"))["documents"] == 40
    assert np.array_equal(ours, np.concatenate([theirs[i] for i in range(len(theirs))]))
    assert np.array_equal(ours, np.concatenate(documents))


@pytest.fixture(scope="module")
def same_tokens_two_ways(tmp_path_factory):
    """A prepared dataset, and a Megatron dataset of exactly its documents written by megatron-core."""
    root = tmp_path_factory.mktemp("megatron")
    files = write_pydoc_jsonl(root / "jsonl")
    prepare([str(f) for f in files], "bpe:400", str(root / "dataset"))
    tokens = np.asarray(open_tokens(str(root / "dataset")))
    starts = np.load(root / "dataset" / "documents.npy")
    _build(root / "corpus_text_document", [tokens[a:b] for a, b in zip(starts[:-1], starts[1:])], np.uint16)
    return root


def test_megatron_trains_with_the_same_losses_as_the_same_tokens(same_tokens_two_ways, tmp_path):
    root = same_tokens_two_ways
    check_ok(run_framework([*FAST, "data=tokens", f"data.path={root / 'dataset'}"], tmp_path / "tokens"))
    check_ok(run_framework([*FAST, "data=megatron", f"data.path={root / 'corpus_text_document'}",
                            "data.vocab_size=400"], tmp_path / "megatron"))
    assert losses(tmp_path / "megatron") == losses(tmp_path / "tokens")
    assert "vocab_size: 400" in (tmp_path / "megatron" / "config.yaml").read_text().split("model:")[1]


@pytest.mark.parametrize("damage,expected", [
    ("extension", "error: data.path: no {p}.bin.bin and {p}.bin.idx; give the prefix without the extension: {p}"),
    ("magic", "error: data.path: {p}.idx: not a Megatron index (no MMIDIDX header)"),
    ("truncated", "error: data.path: {p}.bin is 8 bytes; its index says 10 bytes"),
    ("range", "error: data.vocab_size: {p} holds token id 300, but data.vocab_size is 256"),
])
def test_bad_megatron_data_is_refused_before_launch(tmp_path, damage, expected):
    prefix = tmp_path / "corpus"
    _build(prefix, [[1, 2, 3], [4, 300]], np.uint16)
    path = f"{prefix}.bin" if damage == "extension" else str(prefix)
    if damage == "magic":
        raw = (tmp_path / "corpus.idx").read_bytes()
        (tmp_path / "corpus.idx").write_bytes(b"XXXXXXXXX" + raw[9:])
    elif damage == "truncated":
        (tmp_path / "corpus.bin").write_bytes((tmp_path / "corpus.bin").read_bytes()[:8])
    proc = run_framework([*FAST, "data=megatron", f"data.path={path}", "data.vocab_size=256", "data.seq_len=2",
                          "data.val_fraction=0"], tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == expected.format(p=prefix)
    assert not (tmp_path / "run").exists()
