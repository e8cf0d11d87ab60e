"""Weighted mixtures: shares, determinism from seed and step, exact resume, tokens per source in metrics."""
import numpy as np
import pytest
import torch

from framework.data.batches import GlobalBatchSampler
from framework.data.mixture import BLOCK, MixtureSampler, block_counts
from framework.data.prepare import prepare
from framework.runtime import world
from tests.fixtures.corpora import write_pydoc_jsonl
from tests.harness.helpers import FAST, check_ok, losses, read_metrics, run_framework
from tests.harness.parity import assert_parity

SEQ = 16


def _mixture(weights=(0.75, 0.25), seed=0, gbs=8):
    # Source s holds ids 100000 s + position (600 sequences each): a row's first id says where it came from.
    samplers = [GlobalBatchSampler(np.arange(SEQ * 600 + 1) + 100_000 * s, SEQ, 1, seed, stream=(s + 1,))
                for s in range(len(weights))]
    return MixtureSampler(samplers, list(weights), [f"s{s}" for s in range(len(weights))], gbs, seed)


def _sources(batch: torch.Tensor) -> np.ndarray:
    return (batch[:, 0] // 100_000).numpy()


def test_shares_are_within_two_percent_over_1000_sequences():
    mix = _mixture()
    drawn = np.concatenate([_sources(mix.local_batch(step, 0, 1)) for step in range(125)])   # 1,000 sequences
    assert len(drawn) == 1000
    assert abs(np.mean(drawn == 0) - 0.75) <= 0.02 and abs(np.mean(drawn == 1) - 0.25) <= 0.02
    assert mix.consumed(125) == {"tokens/s0": int(np.sum(drawn == 0)) * SEQ, "tokens/s1": int(np.sum(drawn == 1)) * SEQ}


def test_a_step_depends_only_on_seed_and_step_whatever_the_dp_degree():
    a, b, other_seed = _mixture(), _mixture(), _mixture(seed=1)
    for step in (0, 7, 300):   # 300 is past the first block of positions
        whole = a.local_batch(step, 0, 1)
        assert torch.equal(whole, torch.cat([b.local_batch(step, r, 4) for r in range(4)]))
        assert not torch.equal(whole, other_seed.local_batch(step, 0, 1))


def test_each_source_is_read_in_its_own_order_without_repeats_within_an_epoch():
    mix = _mixture(weights=(0.5, 0.5))
    rows = torch.cat([mix.local_batch(step, 0, 1) for step in range(BLOCK // 8)])   # one block: 512 per source
    for s in (0, 1):
        starts = rows[torch.from_numpy(_sources(rows) == s)][:, 0].tolist()
        assert len(starts) == 512 and len(set(starts)) == 512


def test_block_counts_round_by_largest_remainder():
    assert block_counts([0.75, 0.25]).tolist() == [768, 256]
    assert block_counts([1, 1, 1]).sum() == BLOCK and sorted(block_counts([1, 1, 1]).tolist()) == [341, 341, 342]


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    """Two prepared datasets (halves of the pydoc topics) sharing one BPE tokenizer."""
    root = tmp_path_factory.mktemp("mix")
    first, second = write_pydoc_jsonl(root / "jsonl", parts=2)
    prepare([str(first)], "bpe:400", str(root / "docs_a"))
    prepare([str(second)], str(root / "docs_a" / "tokenizer.json"), str(root / "docs_b"))
    return root


def _mix_args(root, *extra):
    return [*FAST, "data=mix", "data.seq_len=32", "data.val_fraction=0.01", "checkpoint.enabled=true",
            "checkpoint.interval=4",
            f"data.sources=[{{path: {root / 'docs_a'}, weight: 0.75}}, {{path: {root / 'docs_b'}, weight: 0.25}}]",
            *extra]


def test_a_mixture_trains_reports_tokens_per_source_and_resumes_exactly(two_datasets, tmp_path):
    check_ok(run_framework(_mix_args(two_datasets), tmp_path / "full"))
    records = read_metrics(tmp_path / "full")
    last = records[-1]
    assert last["tokens/docs_a"] + last["tokens/docs_b"] == 8 * 8 * 32
    assert last["tokens/docs_a"] > last["tokens/docs_b"] > 0
    assert all(r["tokens/docs_a"] <= s["tokens/docs_a"] for r, s in zip(records, records[1:]))
    run = tmp_path / "run"      # resumes from the full run's step 4 (stop_at_step + resume=auto: test_checkpoint)
    check_ok(run_framework(_mix_args(two_datasets, f"checkpoint.resume={tmp_path / 'full/checkpoints/step_00000004'}"),
                           run))
    assert len(losses(run)) == 4
    assert assert_parity(run, tmp_path / "full")["kind"] == "fp32"
    assert read_metrics(run)[-1]["tokens/docs_a"] == last["tokens/docs_a"]


def test_a_mixture_of_different_tokenizers_is_refused(two_datasets, tmp_path):
    prepare([str(two_datasets / "jsonl" / "topics_1.jsonl")], "bytes", str(tmp_path / "bytes"))
    proc = run_framework([*FAST, "data=mix",
                          f"data.sources=[{{path: {two_datasets / 'docs_a'}}}, {{path: {tmp_path / 'bytes'}}}]"],
                         tmp_path / "refused")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"error: data.sources[1].path: {tmp_path / 'bytes'} was tokenized "
                                                    f"with another tokenizer than {two_datasets / 'docs_a'}; "
                                                    f"a mixture needs one vocabulary")


@pytest.mark.parametrize("override", [
    "data.sources=[{path: a, wieght: 0.5}]",      # a misspelt key inside an entry
    "data.sources=[{path: a, weight: heavy}]",    # a weight that is not a number
    "data.mixture=[{path: a}]",                   # a key the data group does not have
])
def test_bad_mixture_keys_fail_at_compose(compose_config, override):
    with pytest.raises(Exception, match="wieght|heavy|mixture"):
        compose_config(["data=mix", override])


def test_mixture_sources_are_typed(compose_config):
    cfg = compose_config(["data=mix", "data.sources=[{path: a, weight: 3}, {path: b}]"])
    assert [(s.path, s.weight, s.name) for s in cfg.data.sources] == [("a", 3.0, None), ("b", 1.0, None)]


@pytest.mark.parametrize("overrides,expected", [
    (["data=megatron"], "data.path: is required for data.source=megatron; set data.path=/path/to/prefix"),
    (["data=megatron", "data.path=/nonexistent/corpus.bin"],
     "data.path: no /nonexistent/corpus.bin.bin and /nonexistent/corpus.bin.idx; give the prefix without the "
     "extension: /nonexistent/corpus"),
    (["data=mix"], "data.sources: is empty"),
    (["data=mix", "data.sources=[{path: DIR, weight: 0}]"], "data.sources[0].weight: must be positive, got 0.0"),
    (["data=mix", "data.sources=[{path: DIR}, {path: /nonexistent/b}]"],
     "data.sources[1].path: no such file, dataset dir or Megatron prefix: /nonexistent/b"),
    (["data=mix", "data.sources=[{path: DIR, weight: 5000}, {path: DIR, weight: 1, name: other}]"],
     "data.sources[1].weight: 1.0 is too small a share to draw one sequence in 1024"),
    (["data=mix", "data.sources=[{path: DIR}, {path: DIR}]"], "data.sources: two sources are named alike"),
    (["trainer.sample_tokens=0"], "trainer.sample_tokens: must be positive"),
])
def test_bad_data_options_are_refused_before_launch(compose_config, tmp_path, overrides, expected):
    from tests.harness.helpers import derive_and_validate
    from framework.errors import ConfigError
    from framework.launch import admission
    from framework.strategies.registry import strategy_class
    cfg = compose_config(["model=tiny", "data.seq_len=32", *[o.replace("DIR", str(tmp_path)) for o in overrides]])
    cls = strategy_class(cfg.parallel.name)
    with pytest.raises(ConfigError) as error:
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
    assert str(error.value).startswith(expected)
