"""Training on a prepared dataset (JSONL -> BPE -> shards): the loss falls, resume across shard
boundaries is exact, and ddp x2 gives the single-process run."""

import numpy as np
import pytest

from framework.data.batches import build_samplers
from framework.data.token_dataset import read_manifest
from framework.runtime import world
from tests.fixtures.corpora import write_pydoc_jsonl
from tests.harness.helpers import FAST, SAVE_LAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

SHARD_TOKENS = 257     # ~850 shards: every step reads several, and about one sequence in eight straddles two


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_pydoc_jsonl(root / "jsonl", parts=3)
    out = root / "dataset"
    check_ok(run_framework(["--input", str(root / "jsonl" / "*.jsonl"), "--tokenizer", "bpe:512", "--out", str(out),
                            "--shard-tokens", str(SHARD_TOKENS), "--workers", "2"], module="framework.data.prepare"))
    return out


def _args(dataset, *extra):
    return [*FAST, "data=tokens", f"data.path={dataset}", "data.val_fraction=0.01", *extra]


CKPT = ["checkpoint.enabled=true", "checkpoint.interval=4"]


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    """8 single-process steps, with the checkpoint at step 4 that the resume test starts from."""
    run_dir = tmp_path_factory.mktemp("full")
    check_ok(run_framework(_args(dataset, "parallel=single", *CKPT), run_dir))
    return run_dir


def test_dataset_is_sharded_with_a_bpe_vocabulary(dataset):
    manifest = read_manifest(str(dataset))
    assert manifest["vocab_size"] == 512 and manifest["dtype"] == "uint16" and manifest["documents"] > 50
    assert len(manifest["shards"]) > 100 and sum(s["tokens"] for s in manifest["shards"]) == manifest["tokens"]
    starts = np.load(dataset / "documents.npy")
    assert starts[-1] == manifest["tokens"] and len(starts) == manifest["documents"] + 1


def test_model_vocabulary_follows_the_manifest_and_the_loss_falls(uninterrupted):
    config = (uninterrupted / "config.yaml").read_text()
    assert config.count("vocab_size: 512") == 2    # data and model (model=tiny says 256)
    got = losses(uninterrupted)
    assert len(got) == 8 and got[0] == pytest.approx(np.log(512), abs=0.05) and got[-1] < got[0] - 0.1


def test_resume_across_shard_boundaries_is_exact(dataset, uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    step_4 = uninterrupted / "checkpoints" / "step_00000004"
    check_ok(run_framework(_args(dataset, *CKPT, f"checkpoint.resume={step_4}"), run_dir))
    assert len(losses(run_dir)) == 4
    assert assert_parity(run_dir, uninterrupted)["kind"] == "fp32"
    # The resumed steps really read sequences that start in one shard and end in the next.
    cfg = _data_cfg(dataset)
    sampler, _ = build_samplers(cfg, 8, 0, with_val=False)
    starts = np.concatenate([sampler.sequence_ids(step) for step in range(4, 8)]) * cfg.seq_len
    assert np.any(starts // SHARD_TOKENS != (starts + cfg.seq_len) // SHARD_TOKENS)


def test_ddp_two_workers_match_single(dataset, uninterrupted, tmp_path):
    check_ok(run_framework(_args(dataset, SAVE_LAST, "parallel=ddp", "launcher.nproc_per_node=2"), tmp_path / "ddp"))
    assert_parity(tmp_path / "ddp", uninterrupted)


def test_dataset_metadata_is_read_from_the_manifest_not_the_tokens(dataset, tmp_path, compose_config):
    """A token id past the vocabulary is not found by scanning: opening reads only the manifest and sizes,
    and a shard whose size disagrees with the manifest is refused before launch."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in dataset.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    shard = copy / read_manifest(str(copy))["shards"][3]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    proc = run_framework(_args(copy), tmp_path / "refused")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"error: data.path: {shard} is {2 * SHARD_TOKENS - 2} bytes; "
                                                    f"the manifest says {2 * SHARD_TOKENS} bytes")
    assert not (tmp_path / "refused").exists()


def test_model_vocabulary_smaller_than_the_data_is_refused(dataset, tmp_path):
    proc = run_framework(_args(dataset, "model.vocab_size=256"), tmp_path / "refused")
    assert proc.returncode == 2
    assert "error: model.vocab_size: 256 is smaller than the data's vocabulary (data.vocab_size=512)" in proc.stderr


def _data_cfg(dataset):
    from omegaconf import OmegaConf
    return OmegaConf.create({"source": "tokens", "path": str(dataset), "dtype": "uint16", "seq_len": 32,
                             "val_fraction": 0.01, "sources": []})


def test_validation_checks_the_range_from_the_manifest(dataset, compose_config):
    """Without the launcher filling data.vocab_size from the manifest, a smaller one is caught from it."""
    from tests.harness.helpers import derive_and_validate
    from framework.errors import ConfigError
    from framework.launch import admission
    from framework.strategies.registry import strategy_class
    cfg = compose_config(["model=tiny", "data=tokens", f"data.path={dataset}", "data.seq_len=32",
                          "data.vocab_size=300", "model.vocab_size=300"])
    cls = strategy_class("single")
    with pytest.raises(ConfigError, match=f"data.vocab_size: {dataset} was tokenized with a vocabulary of 512, "
                                          f"but data.vocab_size is 300"):
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
