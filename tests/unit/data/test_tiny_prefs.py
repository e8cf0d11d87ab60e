"""The shipped preference pairs (recipe dpo_tiny, the matrix's preference jobs) are what their generator writes,
and every one is a pair the preference source takes: chosen and rejected differ, both assistant answers; they
prepare alike from each format the source reads."""
import json

import numpy as np
import pytest

from framework.data.assets import path as asset_path
from framework.data.assets import tiny_prefs
from framework.data.pairs import pair_of
from framework.data.prepare import ChatOptions, prepare
from framework.data.sources.preference import Preference
from framework.data.token_dataset import open_mask, open_tokens


def test_the_shipped_pairs_are_what_the_generator_writes():
    assert open(asset_path(tiny_prefs.FILE), encoding="utf-8").read() == tiny_prefs.text()


def test_every_shipped_pair_is_a_preference_record():
    pairs = [pair_of(f"row {i}", p) for i, p in enumerate(tiny_prefs.pairs())]
    assert len(pairs) == 256 and all(p.conversation and p.chosen != p.rejected for p in pairs)


def test_pairs_from_parquet_and_a_saved_dataset_prepare_as_from_json_lines(tmp_path):
    """data=preference reads TRL's format from JSONL, Parquet or a saved Hugging Face dataset: the same pairs, the
    same prepared tokens and completion masks (conversations, nested lists of messages, in each)."""
    pq, pa = pytest.importorskip("pyarrow.parquet"), pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    rows = tiny_prefs.pairs()[:8]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "pairs.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    prepared = {}
    for name in ("pairs.jsonl", "pairs.parquet", "saved"):
        out = str(tmp_path / f"{name}-prepared")
        manifest = prepare([str(tmp_path / name)], "bytes", out, chat=ChatOptions("chatml"), source=Preference(),
                           chat_only=True, pairs=True)
        assert manifest["pairs"] and manifest["documents"] == 2 * len(rows), manifest
        prepared[name] = (np.asarray(open_tokens(out)), np.asarray(open_mask(out)))
    tokens, mask = prepared.pop("pairs.jsonl")
    assert mask.any() and not mask.all()
    for name, (other_tokens, other_mask) in prepared.items():
        assert np.array_equal(other_tokens, tokens) and np.array_equal(other_mask, mask), name
