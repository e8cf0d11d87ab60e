"""The shipped preference pairs (recipe dpo_tiny, the matrix's preference jobs) are what their generator writes,
and every one is a pair the preference source takes: chosen and rejected differ, both assistant answers."""
from framework.data.assets import path as asset_path
from framework.data.assets import tiny_prefs
from framework.data.pairs import pair_of


def test_the_shipped_pairs_are_what_the_generator_writes():
    assert open(asset_path(tiny_prefs.FILE), encoding="utf-8").read() == tiny_prefs.text()


def test_every_shipped_pair_is_a_preference_record():
    pairs = [pair_of(f"row {i}", p) for i, p in enumerate(tiny_prefs.pairs())]
    assert len(pairs) == 256 and all(p.conversation and p.chosen != p.rejected for p in pairs)
