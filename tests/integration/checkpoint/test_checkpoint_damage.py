"""A damaged checkpoint is refused before any work, in one line with exit code 2, by a resume and by the
exporter alike, and nothing on disk changes: a changed byte, a missing file, a missing or unreadable
manifest, a truncated shard; and every other branch of the loader's checks (format version, state format,
model, missing state, unreadable metadata, DeepSpeed files). Copies of one saved single-process run's
step dirs, damaged in different ways."""
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from framework.errors import ConfigError
from tests.harness.helpers import FAST, run_framework

SHARD = "state/__0_0.distcp"      # the single process's one DCP data file, the checkpoint's largest


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def _change_a_byte(step: Path) -> None:
    data = bytearray((step / SHARD).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (step / SHARD).write_bytes(bytes(data))


def _truncate(step: Path) -> None:
    with open(step / SHARD, "r+b") as f:
        f.truncate((step / SHARD).stat().st_size // 2)


#: damage -> (what it does to a step dir, what the refusal says)
DAMAGES = {
    "changed-byte": (_change_a_byte, "checksum differs from the one saved"),
    "missing-file": (lambda step: (step / SHARD).unlink(), f"{SHARD} is missing"),
    "truncated-shard": (_truncate, f"{SHARD} is damaged: "),
    "missing-manifest": (lambda step: (step / "meta.json").unlink(), "is not a complete checkpoint (no meta.json)"),
    "unreadable-manifest": (lambda step: (step / "meta.json").write_text("{not json"), "meta.json is corrupt"),
}


@pytest.fixture(scope="module")
def saved(trained_run) -> Path:
    """The checkpoints dir (steps 4 and 8) of the session's single-process run; tests copy, never write."""
    return trained_run("parallel=single") / "checkpoints"


def _copy(saved: Path, dest: Path) -> Path:
    shutil.copytree(saved, dest)
    return dest


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in text, text
    return lines[0]


def export_here(capsys, ckpt: Path, out: Path) -> subprocess.CompletedProcess:
    """`python -m framework.export CKPT OUT`'s main in this process."""
    from framework.export.__main__ import main
    capsys.readouterr()
    code = main([str(ckpt), str(out)])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_checkpoint_is_refused_by_resume_and_export(tmp_path, saved, capsys, damage):
    """The newest checkpoint damaged, the one before it intact: both refusals say what is wrong; a resume
    is pointed at the intact one (a checkpoint without a manifest is no complete checkpoint to point from)."""
    damaged, (do, says) = _copy(saved, tmp_path / "checkpoints") / "step_00000008", DAMAGES[damage]
    do(damaged)
    before = _tree_digest(damaged.parent)
    proc = run_framework([*FAST, f"checkpoint.resume={damaged}"], tmp_path / "run", timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("error: checkpoint.resume: ") and says in line, line
    if "meta.json" not in says:
        assert f"checkpoint.resume={damaged.parent / 'step_00000004'}" in line, line
    assert not (tmp_path / "run").exists()

    exported = export_here(capsys, damaged, tmp_path / "hf")
    assert exported.returncode == 2 and says in _one_line(exported.stderr), exported.stderr
    assert not (tmp_path / "hf").exists() and _tree_digest(damaged.parent) == before


def test_export_names_the_newest_intact_checkpoint_and_says_when_none_is_left(tmp_path, saved, capsys):
    checkpoints = _copy(saved, tmp_path / "checkpoints")
    _change_a_byte(checkpoints / "step_00000008")
    line = _one_line(export_here(capsys, checkpoints / "step_00000008", tmp_path / "hf").stderr)
    assert line.endswith(f"the newest intact checkpoint beside it is {checkpoints / 'step_00000004'}"), line
    _truncate(checkpoints / "step_00000004")
    line = _one_line(export_here(capsys, checkpoints / "step_00000008", tmp_path / "hf").stderr)
    assert "intact" not in line and "checksum differs" in line, line


@pytest.fixture
def checks(compose_config, tmp_path):
    """validate_checkpoint as the launcher runs it, for overrides and a checkpoint to resume: the message
    of the ConfigError it raises (the CLI prints it as the one `error:` line, exit 2)."""
    from framework.checkpoint.rules import validate_checkpoint
    from framework.strategies.registry import strategy_class

    def refusal(resume: Path, *overrides: str) -> str:
        cfg = compose_config([*FAST, f"checkpoint.resume={resume}", *overrides])
        with pytest.raises(ConfigError) as error:
            validate_checkpoint(cfg, strategy_class(cfg.parallel.name), str(tmp_path / "run"))
        assert error.value.key == "checkpoint.resume", error.value
        return str(error.value)
    return refusal


def _edit_meta(step: Path, **changes) -> None:
    meta = json.loads((step / "meta.json").read_text())
    meta.update(changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    (step / "meta.json").write_text(json.dumps(meta))


def test_the_loaders_other_refusals(tmp_path, saved, checks, capsys):
    """Each branch of the checks a resume runs before launch (framework/checkpoint/rules.py
    validate_checkpoint, checkpoint/resume.py and compat.py, checkpoint/unpickle.py), on an edited copy."""
    assert "no such checkpoint directory" in checks(tmp_path / "nowhere")
    lone = _copy(saved / "step_00000008", tmp_path / "lone")
    _truncate(lone)
    assert checks(lone).endswith("no intact checkpoint is left beside it; start without checkpoint.resume")

    step = _copy(saved / "step_00000008", tmp_path / "version")
    _edit_meta(step, version=0)
    assert "has checkpoint format version 0, this framework reads 1" in checks(step)
    assert "holds dcp state (saved by parallel=single); to move weights across, export it" in \
        checks(saved / "step_00000008", "parallel=deepspeed")
    assert "was saved for a different model (model.n_layers: saved 2 vs now 3)" in \
        checks(saved / "step_00000008", "model.n_layers=3")

    # A checkpoint saved before manifests ("files" absent) reaches the checks behind the manifest's.
    old = _copy(saved / "step_00000008", tmp_path / "old")
    _edit_meta(old, files=None)
    (old / "state" / ".metadata").write_bytes(b"not a pickle")
    assert "unreadable checkpoint metadata" in checks(old)
    shutil.rmtree(old / "state")
    assert "has no state/ data" in checks(old)
    assert "is at step 8, not before trainer.max_steps=8; raise trainer.max_steps" in checks(saved / "step_00000008")


def test_deepspeed_files_that_cannot_be_read_are_refused(tmp_path, saved, checks, capsys):
    """The DeepSpeed branches of the safety checks, on a manifest-less copy relabelled as DeepSpeed state."""
    step = _copy(saved / "step_00000004", tmp_path / "ds")
    _edit_meta(step, files=None, format="deepspeed", parallel="deepspeed")
    shutil.rmtree(step / "state")
    (step / "state").mkdir()
    (step / "state" / "latest").write_text("state")
    refusal = checks(step, "parallel=deepspeed")
    assert "holds no DeepSpeed checkpoint files" in refusal
    assert "holds no DeepSpeed checkpoint files" in _one_line(export_here(capsys, step, tmp_path / "hf").stderr)
    (step / "state" / "mp_rank_00_model_states.pt").write_bytes(b"not a checkpoint")
    assert "mp_rank_00_model_states.pt: unreadable" in checks(step, "parallel=deepspeed")
    assert "mp_rank_00_model_states.pt: unreadable" in _one_line(export_here(capsys, step, tmp_path / "hf").stderr)
    assert not (tmp_path / "hf").exists()


def test_export_refuses_a_state_format_it_cannot_read_and_a_state_it_cannot_load(tmp_path, saved, capsys):
    step = _copy(saved / "step_00000004", tmp_path / "other_format")
    _edit_meta(step, format="megatron")
    assert "has state format 'megatron'; export reads dcp and deepspeed" in \
        _one_line(export_here(capsys, step, tmp_path / "hf").stderr)
    step = _copy(saved / "step_00000004", tmp_path / "no_shard")
    _edit_meta(step, files=None)
    (step / SHARD).unlink()
    assert "cannot read the dcp state" in _one_line(export_here(capsys, step, tmp_path / "hf").stderr)
    assert not (tmp_path / "hf").exists()
