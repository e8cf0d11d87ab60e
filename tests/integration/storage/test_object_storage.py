"""Checkpoints in a bucket (checkpoint.dir=s3://..., against moto's S3 server the session starts): an async save,
resume=auto with the uninterrupted losses, export straight from the bucket; a truncated object and a missing
bucket are refused in one line, exit 2, before any work. The storage layer itself on memory:// (no server)."""
import json

import pytest
import torch
from safetensors.torch import load_file

from framework import storage
from framework.checkpoint.manifest import build_manifest, first_damage
from framework.checkpoint.retention import Saved, kept_steps, score_of
from tests.harness.helpers import FAST, check_ok, losses, max_rel_diff, run_framework
from tests.harness.servers import make_bucket, refused

EXACT = 1e-6
SAVING = ["parallel=single", "checkpoint.enabled=true", "checkpoint.interval=4", "checkpoint.async_save=true"]


@pytest.fixture(scope="module")
def resumed_from_s3(s3_env, tmp_path_factory):
    """Saving in the background into a bucket: stopped at step 4, then continued with resume=auto (several ranks
    writing one checkpoint into a bucket: test_ray_engine's ddp job)."""
    root = f"{make_bucket(s3_env, 'resume')}/run"
    run_dir = tmp_path_factory.mktemp("s3_resume")
    first = run_framework([*FAST, *SAVING, f"checkpoint.dir={root}", "trainer.stop_at_step=4"], run_dir, env=s3_env)
    check_ok(first)
    second = run_framework([*FAST, *SAVING, f"checkpoint.dir={root}", "checkpoint.resume=auto"], run_dir, env=s3_env)
    check_ok(second)
    return run_dir, root, second


def test_resume_auto_from_a_bucket_gives_the_uninterrupted_losses(resumed_from_s3, trained_run, s3_here):
    run_dir, root, second = resumed_from_s3
    assert f"checkpoint.resume=auto: looked in {root}: resuming from {root}/step_00000004" in second.stdout
    assert len(losses(run_dir)) == 8
    assert max_rel_diff(losses(trained_run("parallel=single")), losses(run_dir)) <= EXACT
    assert storage.listdir(root) == ["step_00000004", "step_00000008"]
    for step in ("step_00000004", "step_00000008"):      # complete, and every object as its manifest says
        meta = json.loads(storage.read_text(f"{root}/{step}/meta.json"))
        assert meta["files"] and first_damage(f"{root}/{step}", meta["files"]) is None


def test_export_reads_straight_from_the_bucket(resumed_from_s3, trained_run, s3_here, tmp_path):
    from framework.export import export
    _, root, _ = resumed_from_s3
    export(f"{root}/step_00000008", str(tmp_path / "from_s3"))
    export(str(trained_run("parallel=single") / "checkpoints" / "step_00000008"), str(tmp_path / "from_disk"))
    got = load_file(tmp_path / "from_s3" / "model.safetensors")
    want = load_file(tmp_path / "from_disk" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_truncated_object_is_refused_before_any_work(resumed_from_s3, s3_here, tmp_path, compose_config):
    """A copy of the checkpoint whose shard was cut short (the checkpoint in the bucket is left as it was)."""
    import fsspec
    _, root, _ = resumed_from_s3
    fs = fsspec.filesystem("s3")
    copy = f"{make_bucket(s3_here, 'damaged')}/step_00000008"
    fs.copy(f"{root}/step_00000008/", copy + "/", recursive=True)
    shard = f"{copy}/state/__0_0.distcp"
    data = storage.read_bytes(shard)
    storage.write_bytes(shard, data[:len(data) // 2])
    cfg = compose_config([*FAST, *SAVING, f"checkpoint.resume={copy}", "trainer.max_steps=12"])
    said = refused(cfg, tmp_path / "run")
    assert said == [f"error: checkpoint.resume: refusing {copy}: {shard} is damaged: {len(data) // 2} bytes, "
                    f"{len(data)} when saved; no intact checkpoint is left beside it; start without "
                    f"checkpoint.resume"]
    assert storage.size(f"{root}/step_00000008/state/__0_0.distcp") == len(data)


def test_initial_load_reads_hf_weights_from_a_bucket(resumed_from_s3, s3_here, tmp_path, monkeypatch, compose_config):
    """checkpoint.initial_load=s3://...: validated, and the model built from it, as from the same files on disk
    (downloaded once into the machine's cache)."""
    from tests.harness.helpers import derive_and_validate
    from framework.export import export
    from framework.models.factory import ModelFactory
    from framework.strategies.registry import strategy_class
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _, root, _ = resumed_from_s3
    export(f"{root}/step_00000008", str(tmp_path / "hf"))
    url = f"{make_bucket(s3_here, 'weights')}/tiny-hf"
    for file in (tmp_path / "hf").iterdir():
        storage.write_bytes(f"{url}/{file.name}", file.read_bytes())
    built = {}
    for where in (url, str(tmp_path / "hf")):
        cfg = compose_config([*FAST, f"checkpoint.initial_load={where}"])
        derive_and_validate(cfg, 1, strategy_class("single"), explicit=set())
        built[where] = ModelFactory(cfg)().state_dict()
    assert all(torch.equal(built[url][k], built[str(tmp_path / "hf")][k]) for k in built[url])
    seeded = ModelFactory(compose_config(FAST))().state_dict()      # the trained weights, not the seeded init
    assert not all(torch.equal(built[url][k], seeded[k]) for k in seeded)
    assert len(list((tmp_path / "cache" / "framework" / "downloads").iterdir())) == 1


def test_a_missing_bucket_is_one_line_and_exit_2_before_any_work(s3_here, tmp_path, compose_config):
    said = refused(compose_config([*FAST, *SAVING, "checkpoint.dir=s3://no-such-bucket/run"]), tmp_path / "run")
    assert said == ["error: checkpoint.dir: s3://no-such-bucket/run: no such bucket or container"]


# ---- the storage layer and the retention rule, in this process ------------------------------------------------

def test_storage_on_an_object_store_lists_reads_and_removes_by_prefix():
    root = "memory://fw-test/ckpt"
    storage.write_text(f"{root}/step_00000004/state/a.distcp", "abc")
    storage.write_text(f"{root}/step_00000004/meta.json", "{}")
    storage.write_text(f"{root}/.step_00000008.partial/x", "y")
    assert storage.listdir(root) == [".step_00000008.partial", "step_00000004"]
    assert storage.file_sizes(f"{root}/step_00000004") == {"state/a.distcp": 3, "meta.json": 2}
    assert storage.isdir(f"{root}/step_00000004") and not storage.isdir(f"{root}/step_00000005")
    manifest = build_manifest(f"{root}/step_00000004", skip=("meta.json",))
    assert first_damage(f"{root}/step_00000004", manifest) is None
    storage.write_text(f"{root}/step_00000004/state/a.distcp", "ab")
    assert "is damaged: 2 bytes, 3 when saved" in first_damage(f"{root}/step_00000004", manifest)
    storage.remove_tree(f"{root}/step_00000004", first="meta.json")
    assert storage.listdir(root) == [".step_00000008.partial"]
    storage.remove_tree(root)


def test_a_bucket_that_refuses_writes_is_a_storage_error(s3_here):
    with pytest.raises(storage.StorageError, match="no such bucket"):
        storage.check_writable("s3://not-made-yet/prefix")
    bucket = make_bucket(s3_here, "writable")
    storage.check_writable(f"{bucket}/prefix")
    assert storage.listdir(f"{bucket}/prefix") == []      # the probe object is gone again


@pytest.mark.parametrize("mode,best", [("min", {2, 6}), ("max", {4, 8})])
def test_retention_keeps_the_newest_and_the_best(mode, best):
    saved = [Saved(2, 1.0), Saved(4, 3.0), Saved(6, 0.5), Saved(8, 2.0), Saved(10, None)]
    assert kept_steps(saved, keep_last=1, keep_best=2, mode=mode) == best | {10}
    assert kept_steps(saved, keep_last=2) == {8, 10}
    assert score_of({"val_loss": float("nan")}, "val_loss") is None and score_of({"loss": 2}, "loss") == 2.0
