"""Checkpoints on real files: exact and resharded resume, atomic saves, refusal of bad checkpoints,
crash recovery with real SIGKILLs."""
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

from tests.harness.helpers import DEEPSPEED_Z2, DEEPSPEED_Z3, FAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

from tests.conftest import CHECKPOINTED as CKPT

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True


def _train(run_dir: Path, *args, **kw):
    proc = run_framework([*FAST, *CKPT, *args], run_dir, **kw)
    check_ok(proc)
    return losses(run_dir)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def step_4(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step_00000004"


@pytest.fixture(scope="module")
def uninterrupted(trained_run):
    """The reference: 8 steps in one single-process run, with checkpoints at 4 and 8."""
    run_dir = trained_run("parallel=single")
    return run_dir, losses(run_dir)


@pytest.mark.parametrize("layout", [
    ["parallel=single"],
    ["parallel=ddp"],
    ["parallel=ddp", "zero=stage1"],
    ["parallel=fsdp", "zero=stage3"],
    ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=2", "zero=stage3"],
    list(DEEPSPEED_Z2),
    list(DEEPSPEED_Z3),
    # bf16 parameters rounded stochastically: the draws come from torch's generator, which the checkpoint restores
    ["parallel=single", "precision=bf16", "precision.store_dtype=bfloat16", "optimizer=adamw_bf16"],
], ids=lambda a: "-".join(x.split("=")[1].rsplit("/", 1)[-1] for x in a))
def test_resume_is_exact(tmp_path, trained_run, layout):
    """Resuming at step 4 gives steps 5..8 of the same layout's uninterrupted run (same schedule), bit for
    bit. Single also goes through stop_at_step and resume=auto in one run dir: each step logged once."""
    reference_dir = trained_run(*layout)
    if layout == ["parallel=single"]:
        run_dir = tmp_path / "run"
        first = _train(run_dir, *layout, "trainer.stop_at_step=4")
        assert len(first) == 4 and (step_4(run_dir) / "meta.json").exists()
        resumed = _train(run_dir, *layout, "checkpoint.resume=auto")
        assert len(resumed) == 8    # metrics.jsonl holds each step once
        assert assert_parity(run_dir, reference_dir)["kind"] == "fp32"
        return
    resumed = _train(tmp_path / "resumed", *layout, f"checkpoint.resume={step_4(reference_dir)}")
    assert len(resumed) == 4
    assert assert_parity(tmp_path / "resumed", reference_dir)["kind"] == "fp32"


@pytest.mark.parametrize("saved,resumed", [
    (["parallel=ddp", "zero=stage1"], ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=4"]),
    (["parallel=fsdp", "zero=stage3"], ["parallel=single"]),
    (["parallel=single"], ["parallel=ddp", "launcher.nproc_per_node=2"]),
    (["parallel=fsdp", "zero=stage2", "parallel.dp_replicate=2", "parallel.dp_shard=2"], ["parallel=ddp", "zero=stage1"]),
    (["parallel=fsdp", "zero=stage3"], ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=2"]),
    (["parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=1"], ["parallel=single"]),
], ids=["ddp_z1x2-to-fsdp_x4", "fsdp_x2-to-single", "single-to-ddp_x2", "hsdp_2x2-to-ddp_z1", "fsdp_x2-to-3d_tp2dp2",
        "3d_tp2pp2-to-single"])
def test_resharded_resume_continues_the_curve(tmp_path, uninterrupted, trained_run, saved, resumed):
    reference_dir, _ = uninterrupted
    second = tmp_path / "second"
    got = _train(second, *resumed, f"checkpoint.resume={step_4(trained_run(*saved))}")
    assert len(got) == 4
    assert_parity(second, reference_dir)


PIPELINE = ["model.n_layers=4", "parallel=3d", "parallel.tp=1", "parallel.dp_shard=1", "parallel.pp=2",
            "parallel.pp_schedule=Interleaved1F1B", "parallel.pp_virtual_stages=2"]


def test_pipeline_checkpoint_holds_full_model_names_and_reshards_to_other_layouts(tmp_path, trained_run):
    """Interleaved pipeline ranks hold two stages each; their checkpoint must look like the full model's,
    so it resumes under fsdp (and 3d tp x dp) exactly where the uninterrupted 3d run goes."""
    reference_dir = trained_run(*PIPELINE)
    ckpt = step_4(reference_dir)
    for name, layout in (("fsdp", ["model.n_layers=4", "parallel=fsdp", "zero=stage3"]),
                         ("tpdp", ["model.n_layers=4", "parallel=3d", "parallel.tp=2", "parallel.pp=1",
                                   "parallel.dp_shard=2", "zero=stage2"])):
        _train(tmp_path / name, *layout, f"checkpoint.resume={ckpt}")
        assert_parity(tmp_path / name, reference_dir)


@pytest.mark.parametrize("layout", [["parallel=single"], ["parallel=fsdp", "zero=stage3"]], ids=["single", "fsdp"])
def test_background_saves_are_complete_and_resume_exactly(tmp_path, uninterrupted, layout):
    reference_dir, _ = uninterrupted
    run_dir = tmp_path / "run"
    _train(run_dir, *layout, "checkpoint.async_save=true", "checkpoint.interval=2", "checkpoint.keep_last=4",
           "trainer.stop_at_step=6")
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000002", "step_00000004", "step_00000006"]
    resumed = tmp_path / "resumed"
    _train(resumed, *layout, f"checkpoint.resume={ckpts / 'step_00000004'}")
    assert_parity(resumed, reference_dir)


def test_keep_last_prunes_old_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    _train(run_dir, "checkpoint.interval=2", "checkpoint.keep_last=2")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000006", "step_00000008"]


def test_kill_during_save_leaves_the_previous_checkpoint_usable(tmp_path, uninterrupted):
    reference_dir, _ = uninterrupted
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, *CKPT], run_dir, env={"FRAMEWORK_FAULT": "save:8"})
    assert proc.returncode != 0
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "step_00000004" / "meta.json").exists()
    assert not (ckpts / "step_00000008").exists() and (ckpts / ".step_00000008.partial").exists()
    _train(run_dir, "checkpoint.resume=auto")
    assert assert_parity(run_dir, reference_dir)["kind"] == "fp32"
    assert (ckpts / "step_00000008" / "meta.json").exists() and not (ckpts / ".step_00000008.partial").exists()


def test_incompatible_checkpoint_is_refused_and_left_untouched(tmp_path, uninterrupted):
    full_dir, _ = uninterrupted
    ckpt = full_dir / "checkpoints" / "step_00000004"
    before = _tree_digest(full_dir / "checkpoints")
    proc = run_framework([*FAST, "model.dim=64", f"checkpoint.resume={ckpt}"], tmp_path / "r")
    assert proc.returncode == 2
    assert "model.dim: saved 32 vs now 64" in proc.stderr and "Traceback" not in proc.stderr
    assert _tree_digest(full_dir / "checkpoints") == before


def test_corrupt_checkpoint_is_refused(tmp_path, uninterrupted):
    full_dir, _ = uninterrupted
    broken = tmp_path / "broken"
    os.system(f"cp -r {full_dir / 'checkpoints' / 'step_00000004'} {broken}")
    (broken / "meta.json").write_text("{not json")
    proc = run_framework([*FAST, f"checkpoint.resume={broken}"], tmp_path / "r")
    assert proc.returncode == 2 and "meta.json is corrupt" in proc.stderr
    (broken / "meta.json").unlink()
    proc = run_framework([*FAST, f"checkpoint.resume={broken}"], tmp_path / "r")
    assert proc.returncode == 2 and "is not a complete checkpoint" in proc.stderr


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("target", ["state/.metadata", "rng/rank_00000.pt"])
def test_crafted_pickle_is_refused_and_runs_no_code(tmp_path, uninterrupted, target):
    full_dir, _ = uninterrupted
    ckpt = tmp_path / "ckpt"
    os.system(f"cp -r {full_dir / 'checkpoints' / 'step_00000004'} {ckpt}")
    marker = tmp_path / "pwned"
    (ckpt / target).write_bytes(pickle.dumps(_Exploit(marker)))
    proc = run_framework([*FAST, f"checkpoint.resume={ckpt}"], tmp_path / "r")
    assert proc.returncode == 2, proc.stderr
    assert "refuse" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_nonfinite_loss_abort_and_skip(tmp_path):
    model = ["model=custom", "model._target_=tests.fixtures.models.NaNAtStep", "+model.nan_at_forward=5"]
    fast = [a for a in FAST if a != "model=tiny"]
    proc = run_framework([*fast, *model, "checkpoint.enabled=true"], tmp_path / "abort")
    assert proc.returncode not in (0, 2) and "trainer.on_nonfinite=skip" in proc.stderr
    assert not (tmp_path / "abort" / "checkpoints").exists()   # nothing non-finite was saved
    run_dir = tmp_path / "skip"
    check_ok(run_framework([*fast, *model, "trainer.on_nonfinite=skip", "checkpoint.enabled=true"], run_dir))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 8
    bad = [r for r in records if r["loss"] != r["loss"]]
    assert [r["step"] for r in bad] == [2]     # 4 micro-batches a step: forward 5 is in step 2
    assert all(r["loss"] == r["loss"] for r in records if r["step"] != 2)
    assert (run_dir / "checkpoints" / "step_00000008" / "meta.json").exists()


def test_truncated_shard_is_refused_naming_the_newest_intact_checkpoint(tmp_path, uninterrupted):
    full_dir, _ = uninterrupted
    copy = tmp_path / "checkpoints"
    os.system(f"cp -r {full_dir / 'checkpoints'} {copy}")
    newest = copy / "step_00000008"
    meta = json.loads((newest / "meta.json").read_text())
    shard = max(meta["files"], key=lambda rel: meta["files"][rel]["size"])   # the biggest file: a state shard
    with open(newest / shard, "r+b") as f:
        f.truncate(meta["files"][shard]["size"] // 2)
    before = _tree_digest(copy)
    proc = run_framework([*FAST, *CKPT, "trainer.max_steps=12", f"checkpoint.dir={copy}",
                          "checkpoint.resume=auto"], tmp_path / "r", timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint.resume: ") and "Traceback" not in proc.stdout
    assert f"{newest / shard} is damaged" in lines[0]
    assert f"checkpoint.resume={copy / 'step_00000004'}" in lines[0]
    assert _tree_digest(copy) == before


def test_manifest_lists_every_file_of_the_checkpoint(uninterrupted):
    full_dir, _ = uninterrupted
    ckpt = full_dir / "checkpoints" / "step_00000008"
    files = json.loads((ckpt / "meta.json").read_text())["files"]
    on_disk = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()} - {"meta.json"}
    assert set(files) == on_disk and all(entry["size"] == (ckpt / rel).stat().st_size for rel, entry in files.items())


def test_rerun_of_a_finished_job_exits_0_as_already_complete(uninterrupted):
    """A re-submitted sweep point or requeued cluster job whose newest checkpoint is at max_steps."""
    full_dir, reference = uninterrupted
    before = _tree_digest(full_dir / "checkpoints")
    proc = run_framework([*FAST, *CKPT, "checkpoint.resume=auto"], full_dir, timeout=60)
    check_ok(proc)
    assert "already complete" in proc.stdout and "step_00000008" in proc.stdout
    assert _tree_digest(full_dir / "checkpoints") == before and losses(full_dir) == reference
    proc = run_framework([*FAST, *CKPT, f"checkpoint.resume={full_dir / 'checkpoints' / 'step_00000008'}"],
                         full_dir, timeout=60)
    assert proc.returncode == 2 and "raise trainer.max_steps" in proc.stderr   # an explicit path stays an error


@pytest.mark.parametrize("layout", [["parallel=ddp"], DEEPSPEED_Z3], ids=["ddp", "ds_z3"])
def test_the_manifest_the_ranks_build_together_lists_every_file_once(trained_run, layout):
    """Each rank checksums its share of a checkpoint's files; rank 0's meta.json lists every file (but
    itself) with the size and CRC-32 one process computes over the whole directory."""
    from framework.checkpoint.manifest import build_manifest
    for step_dir in sorted((trained_run(*layout) / "checkpoints").glob("step_*")):
        saved = json.loads((step_dir / "meta.json").read_text())["files"]
        assert saved == build_manifest(str(step_dir), skip=("meta.json",))


def test_shares_split_files_once_by_bytes():
    from framework.checkpoint.manifest import shares
    sizes = {f"f{i}": size for i, size in enumerate([100, 90, 50, 40, 30, 10, 5, 1])}
    parts = shares(sizes, 3)
    assert sorted(k for p in parts for k in p) == sorted(sizes)
    loads = [sum(p.values()) for p in parts]
    assert max(loads) - min(loads) <= max(sizes.values())
    assert shares(sizes, 3) == parts        # every rank computes the same split
