"""Signed checkpoints (FRAMEWORK_CHECKPOINT_KEY): docs/concepts/checkpoints.md's commands run as written, in
order, from a directory outside the checkout (shortened to 2 steps, then 1 more), with a key in the
environment: the save is signed, its resume and export verify it, the key is in no file and no output, and
no single-process save or load prints DCP's warning that it has no process group. Then copies of that
checkpoint, changed as whoever can write its directory would - a byte flipped with the CRC-32 and size kept,
meta.json edited, a file added, the same checkpoint unsigned - and a wrong or short key are refused in one
line, exit 2, by a resume (the launching process's check, and the worker's own), the exporter and
generation; while without the key the forged byte passes the CRC-32 check, as it would anyone's. Two ranks
hash and verify their shares of the files."""
import json
import secrets
import shutil
from pathlib import Path

import pytest

from framework.checkpoint.resume import damage
from framework.checkpoint.signing import KEY_ENV
from tests.harness import payloads
from tests.harness.docs_commands import environment, run_by
from tests.harness.helpers import FAST, check_ok, run_framework
from tests.integration.checkpoint.test_checkpoint_safety import export_here, generate_here, one_error, resume_checked

KEY = secrets.token_hex(32)
SHARD = "state/__0_0.distcp"
DCP_WARNING = ("torch.distributed is disabled", "return func(*args, **kwargs)")


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """The page's commands, run in a fresh directory with the key set: (that directory, the signed step dir,
    everything the commands printed)."""
    cwd = tmp_path_factory.mktemp("signing")
    save, resume, export = run_by(__file__)
    printed = []
    for command, steps in ((save, 2), (resume, 3), (export, None)):
        module, *args = command.text.split()[2:]
        proc = run_framework([*args, *([f"trainer.max_steps={steps}"] if steps else [])], module=module, cwd=cwd,
                             env={KEY_ENV: KEY, **environment(command)}, timeout=600)
        check_ok(proc)
        printed.append(proc.stdout + proc.stderr)
    assert "resuming from ./signed/step_00000002" in printed[1] and "wrote ./signed-hf from ./signed/step_00000003" \
        in printed[2], printed
    return cwd, cwd / "signed" / "step_00000003", "\n".join(printed)


def test_a_signed_save_verifies_and_the_key_is_in_no_file_and_no_output(signed, monkeypatch):
    cwd, step, printed = signed
    meta = json.loads((step / "meta.json").read_text())
    assert len(meta["signature"]) == 64 and all(len(entry["sha256"]) == 64 for entry in meta["files"].values())
    monkeypatch.setenv(KEY_ENV, KEY)
    assert damage(str(step)) is None
    files = [p for p in cwd.rglob("*") if p.is_file()]
    assert len(files) > 20 and (cwd / "signed-hf" / "model.safetensors") in files
    assert not [p for p in files if KEY.encode() in p.read_bytes()] and KEY not in printed
    assert not [w for w in DCP_WARNING if w in printed], printed


@pytest.fixture
def forged(signed, tmp_path) -> Path:
    """A copy of the signed checkpoint whose shard has a byte flipped, with its size and CRC-32 kept."""
    step = Path(shutil.copytree(signed[1], tmp_path / "forged"))
    data = (step / SHARD).read_bytes()
    (step / SHARD).write_bytes(payloads.flip_keeping_crc(data, len(data) // 2))
    return step


def test_a_byte_flipped_with_its_crc_kept_passes_the_crc_and_is_refused_with_the_key(forged, tmp_path, capsys,
                                                                                    monkeypatch, compose_config):
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert damage(str(forged)) is None                 # CRC-32 and sizes match: what the manifest alone says
    monkeypatch.setenv(KEY_ENV, KEY)
    says = f"{forged / SHARD} is damaged: its SHA-256 differs from the signed one"
    said = resume_checked(compose_config, str(forged), tmp_path / "run", "trainer.max_steps=4")
    assert len(said) == 1 and said[0].startswith(f"error: checkpoint.resume: refusing {forged}: {says}"), said
    for proc in (export_here(capsys, forged, tmp_path / "hf"), generate_here(capsys, forged)):
        one_error(proc.returncode, proc.stderr, says)
    # a worker verifies too (its share of the files) before it reads any of them
    proc = run_framework([*FAST, f"checkpoint.resume={forged}", "trainer.max_steps=4"], tmp_path / "worker",
                         module="tests.fixtures.resume_unchecked", env={KEY_ENV: KEY})
    one_error(proc.returncode, proc.stderr, f"error: checkpoint.resume: refusing {forged}: {says}")
    assert not (tmp_path / "hf").exists()


def test_unsigned_edited_extended_and_wrongly_keyed_checkpoints_are_refused(signed, trained_run, tmp_path, capsys,
                                                                           monkeypatch, compose_config):
    unsigned = trained_run("parallel=single") / "checkpoints" / "step_00000004"    # trained without the key
    monkeypatch.setenv(KEY_ENV, KEY)
    edited = Path(shutil.copytree(signed[1], tmp_path / "edited"))
    meta = json.loads((edited / "meta.json").read_text())
    (edited / "meta.json").write_text(json.dumps({**meta, "step": 1}))
    extended = Path(shutil.copytree(signed[1], tmp_path / "extended"))
    (extended / "rng" / "rank_00001.pt").write_bytes((extended / "rng" / "rank_00000.pt").read_bytes())
    cases = {
        edited: f"{edited}/meta.json has a signature that {KEY_ENV} did not make",
        extended: f"{extended / 'rng' / 'rank_00001.pt'} is not in the signed manifest",
        unsigned: f"{unsigned}/meta.json is not signed, and {KEY_ENV} is set",
    }
    for step, says in cases.items():
        said = resume_checked(compose_config, str(step), tmp_path / "run", "trainer.max_steps=4")
        assert len(said) == 1 and f"refusing {step}: {says}" in said[0], said
        for proc in (export_here(capsys, step, tmp_path / "hf"), generate_here(capsys, step)):
            one_error(proc.returncode, proc.stderr, says)
    monkeypatch.setenv(KEY_ENV, secrets.token_hex(32))          # another key
    says = f"{signed[1]}/meta.json has a signature that {KEY_ENV} did not make"
    said = resume_checked(compose_config, str(signed[1]), tmp_path / "run", "trainer.max_steps=4")
    assert len(said) == 1 and says in said[0], said
    one_error(*(lambda p: (p.returncode, p.stderr))(export_here(capsys, signed[1], tmp_path / "hf")), says)
    assert not (tmp_path / "hf").exists()


def test_a_short_key_is_refused_in_one_line(signed, tmp_path, capsys, monkeypatch, compose_config):
    monkeypatch.setenv(KEY_ENV, "hunter2")
    says = f"{KEY_ENV}: holds 7 characters; a signing key needs at least 32"
    said = resume_checked(compose_config, str(signed[1]), tmp_path / "run", "trainer.max_steps=4")
    assert len(said) == 1 and said[0].startswith(f"error: {says}"), said
    for proc in (export_here(capsys, signed[1], tmp_path / "hf"), generate_here(capsys, signed[1])):
        one_error(proc.returncode, proc.stderr, says)
    assert "hunter2" not in said[0]


def test_ranks_sign_and_verify_their_shares_of_the_files(tmp_path):
    """Two ranks: each hashes its share of the files as it saves, and each verifies its share as it resumes
    (the resume continues; a forged copy is refused by the workers, whose launcher says so once)."""
    ddp, key = ["parallel=ddp", "launcher.nproc_per_node=2", "checkpoint.enabled=true"], {KEY_ENV: KEY}
    check_ok(run_framework([*FAST, *ddp, "trainer.max_steps=2"], tmp_path / "saved", env=key))
    step = tmp_path / "saved" / "checkpoints" / "step_00000002"
    meta = json.loads((step / "meta.json").read_text())
    assert {"__0_0.distcp", "__1_0.distcp"} <= {Path(rel).name for rel in meta["files"]} and "signature" in meta
    assert all("sha256" in entry for entry in meta["files"].values())
    check_ok(run_framework([*FAST, *ddp, f"checkpoint.resume={step}", "trainer.max_steps=3"], tmp_path / "resumed",
                           env=key))
    forged = Path(shutil.copytree(step, tmp_path / "forged"))
    shard = forged / "state" / "__1_0.distcp"
    shard.write_bytes(payloads.flip_keeping_crc(shard.read_bytes(), 100))
    proc = run_framework([*FAST, *ddp, f"checkpoint.resume={forged}", "trainer.max_steps=3"], tmp_path / "worker",
                         module="tests.fixtures.resume_unchecked", env=key)
    one_error(proc.returncode, proc.stderr, f"error: checkpoint.resume: refusing {forged}: {shard} is damaged: its "
                                            f"SHA-256 differs from the signed one", spawned=True)
