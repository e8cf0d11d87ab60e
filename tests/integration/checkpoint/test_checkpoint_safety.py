"""Loading a checkpoint never runs code from it. Pickles that create a canary file when unpickled (each
protocol, GLOBAL and STACK_GLOBAL, dotted names such as torch.os.system and os.system under DCP's own
modules) are planted in copies of real checkpoints - DCP's `.metadata`, a non-tensor and a tensor entry of a
`.distcp` file, an RNG file, DeepSpeed's model and optimizer files, a QLoRA run's NF4 weight - with the
manifest rewritten to match, so that only the unpickler stands between them and their execution. A resume
(the launching process's check, and the workers on their own where that check is skipped), the exporter and
generation refuse each in one `error:` line naming the file, exit 2, from a local dir and from an S3 bucket;
the canary is never created. The same checkpoints, untouched, still resume and export."""
import copyreg
import io
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from framework import storage
from framework.checkpoint.dcp_reader import RestrictedLoadPlanner, reader
from framework.checkpoint.unpickle import UnsafeCheckpointError, load_pickle, load_torch
from tests.harness import payloads
from tests.harness.helpers import DEEPSPEED_Z2, FAST, check_ok, read_metrics, run_framework
from tests.harness.servers import make_bucket, refused

STEP = "step_00000004"
QLORA = ("parallel=single", "lora.enabled=true", "lora.rank=4", "lora.base_dtype=nf4")
FLOAT8_LORA = ("parallel=single", "lora.enabled=true", "lora.rank=4", "lora.base_dtype=float8")


@pytest.fixture(scope="module")
def single(trained_run) -> Path:
    """Step 4 of the session's single-process run (tests copy it, never write into it)."""
    return trained_run("parallel=single") / "checkpoints" / STEP


@pytest.fixture(scope="module")
def deepspeed(trained_run) -> Path:
    """Step 4 of the session's two-worker DeepSpeed ZeRO-2 run."""
    return trained_run(*DEEPSPEED_Z2) / "checkpoints" / STEP


@pytest.fixture(scope="module")
def qlora(trained_run) -> Path:
    """Step 4 of a single-process QLoRA run: its adapted linears' frozen weights are NF4 tensors."""
    return trained_run(*QLORA) / "checkpoints" / STEP


def copied(step: Path, dest: Path) -> Path:
    shutil.copytree(step, dest)
    return dest


def one_error(code: int, stderr: str, names: str, spawned: bool = False) -> str:
    """The refusal: exit 2, exactly one `error:` line, naming `names`, no traceback (`spawned`: workers the
    launcher spawned, where torch's elastic agent logs the exit with a traceback, and so does a peer that lost
    its link to the worker that exited, before the launcher's line)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and (spawned or "Traceback" not in stderr), (code, stderr[-3000:])
    assert names in errors[0], errors[0]
    return errors[0]


def resumed(step: Path, run_dir: Path, module: str = "framework", env: dict | None = None, *extra: str):
    """`python -m framework` resuming `step` (module: tests.fixtures.resume_unchecked skips the launching
    process's check, so the workers meet the checkpoint themselves)."""
    return run_framework([*FAST, f"checkpoint.resume={step}", *extra], run_dir, module=module, env=env, timeout=300)


def export_here(capsys, step: str, out: Path) -> subprocess.CompletedProcess:
    """`python -m framework.export STEP OUT`'s main, in this process."""
    from framework.export.__main__ import main
    capsys.readouterr()
    code = main([str(step), str(out)])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


def generate_here(capsys, step: Path) -> subprocess.CompletedProcess:
    """`python -m framework.generate STEP --prompt ...`'s main, in this process."""
    from framework.generate import main
    capsys.readouterr()
    code = main([str(step), "--prompt", "def ", "--max-new-tokens", "2"])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


def resume_checked(compose_config, step: str, run_dir: Path, *extra: str) -> list[str]:
    """What the launching process's check says of resuming `step`, in this process (exit 2, nothing written)."""
    return refused(compose_config([*FAST, f"checkpoint.resume={step}", *extra]), run_dir)


# ---- the readers, on their own ------------------------------------------------------------------------------

def test_every_way_a_plain_pickle_reaches_a_callable_is_refused_by_name(tmp_path):
    canary = tmp_path / "canary"
    for name, data in payloads.plain_pickles(payloads.touch(canary)).items():
        with pytest.raises(UnsafeCheckpointError) as refusal:
            load_pickle(data, "state/.metadata")
        assert str(refusal.value).startswith("state/.metadata: refuses to unpickle ") and "system" in \
            str(refusal.value), (name, refusal.value)
        assert not canary.exists(), name
        pickle.loads(data)          # the payload is live: plain pickle runs it
        assert canary.exists(), name
        canary.unlink()
    copyreg.add_extension("posix", "system", 240)      # an EXT opcode names its global through copyreg's registry
    try:
        data = pickle.dumps(payloads.Runs(payloads.touch(canary)), protocol=2)
        assert b"\x82\xf0" in data
        with pytest.raises(UnsafeCheckpointError, match="refuses to unpickle posix.system"):
            load_pickle(data, "state/.metadata")
    finally:
        copyreg.remove_extension("posix", "system", 240)
    with pytest.raises(UnsafeCheckpointError, match="refuses to unpickle a persistent id"):
        load_pickle(b"\x80\x02X\x01\x00\x00\x00aQ.", "state/.metadata")     # BINPERSID
    assert not canary.exists()


def test_every_way_a_torch_file_reaches_a_callable_is_refused_by_name(tmp_path):
    canary = tmp_path / "canary"
    for name, data in payloads.torch_files(payloads.touch(canary)).items():
        with pytest.raises(UnsafeCheckpointError) as refusal:
            load_torch(data, "rng/rank_00000.pt")
        message = str(refusal.value)
        assert message.startswith("rng/rank_00000.pt: refuses ") and "system" in message, (name, message)
        assert "\n" not in message and not canary.exists(), name
        torch.load(io.BytesIO(data), weights_only=False)    # live
        assert canary.exists(), name
        canary.unlink()


def test_the_restricted_planner_reads_what_torchs_own_reads(single):
    """Every non-tensor entry (252 optimizer hyper-parameters of the tiny model) and tensor of a real
    checkpoint, read through the restricted reader and planner into the nested state dict a resume passes,
    equals what DCP's default reader and planner read."""
    state_dir = single / "state"

    def empty_state():
        state = {"model": {}, "optim": {}}
        for fqn, m in payloads.read_metadata(state_dir).state_dict_metadata.items():
            top, rest = fqn.split(".", 1)
            state[top][rest] = torch.zeros(m.size, dtype=m.properties.dtype) if hasattr(m, "size") else "unread"
        return state
    ours, theirs = empty_state(), empty_state()
    dcp.load(ours, storage_reader=reader(str(state_dir)), planner=RestrictedLoadPlanner(), no_dist=True)
    dcp.load(theirs, checkpoint_id=str(state_dir), no_dist=True)
    assert len(payloads.byte_entries(state_dir)) == 252
    for top in theirs:
        assert ours[top].keys() == theirs[top].keys()
        for key, value in theirs[top].items():
            if torch.is_tensor(value):
                assert torch.equal(ours[top][key], value) and value.abs().sum() > 0, key
            else:
                assert ours[top][key] == value and value != "unread", key


# ---- planted in real checkpoints ----------------------------------------------------------------------------

def test_a_metadata_payload_is_refused_by_resume_export_and_generate(single, tmp_path, capsys, compose_config):
    canary = tmp_path / "canary"
    for name, data in payloads.plain_pickles(payloads.touch(canary)).items():
        step = copied(single, tmp_path / name)
        (step / "state" / ".metadata").write_bytes(data)
        payloads.rewrite_manifest(step)
        metadata = str(step / "state" / ".metadata")
        said = resume_checked(compose_config, str(step), tmp_path / "run")
        assert len(said) == 1 and said[0].startswith("error: checkpoint.resume: ") and metadata in said[0], said
        assert "refuses to unpickle" in said[0] and "system" in said[0], said
        for proc in (export_here(capsys, step, tmp_path / "hf"), generate_here(capsys, step)):
            one_error(proc.returncode, proc.stderr, f"{metadata}: refuses to unpickle")
        assert not canary.exists() and not (tmp_path / "hf").exists(), name
    # end to end, and in the worker itself when the launching process's check is skipped
    step = tmp_path / "stack-global-under-dcp-module"
    for module in ("framework", "tests.fixtures.resume_unchecked"):
        proc = resumed(step, tmp_path / module, module)
        one_error(proc.returncode, proc.stderr, f"{step / 'state' / '.metadata'}: refuses to unpickle "
                                                f"torch.distributed.checkpoint.filesystem.os.system")
    assert not canary.exists()


def test_a_distcp_entry_payload_is_refused_where_it_is_read(single, tmp_path, capsys):
    """A non-tensor entry (the optimizer's hyper-parameters: torch's own planner unpickles them with
    weights_only=False) is read by a resume only; a tensor entry by export and generation too."""
    canary = tmp_path / "canary"
    files = payloads.torch_files(payloads.touch(canary))
    for name in ("global-protocol-2", "stack-global-dotted"):
        step = copied(single, tmp_path / f"bytes-{name}")
        entry = payloads.byte_entries(step / "state")[0]
        shard = payloads.plant_entry(step / "state", entry, files[name])
        payloads.rewrite_manifest(step)
        proc = resumed(step, tmp_path / f"run-{name}")    # the metadata is sound: the worker meets the entry
        line = one_error(proc.returncode, proc.stderr, f"{shard}: entry {entry}: refuses")
        assert line.startswith("error: checkpoint.resume: ") and "system" in line, line
        assert export_here(capsys, step, tmp_path / "hf").returncode == 0    # export never reads it
        shutil.rmtree(tmp_path / "hf")
    step = copied(single, tmp_path / "tensor")
    shard = payloads.plant_entry(step / "state", "model.layers.0.attention.wq.weight", files["global-protocol-2"])
    payloads.rewrite_manifest(step)
    for proc in (export_here(capsys, step, tmp_path / "hf"), generate_here(capsys, step)):
        one_error(proc.returncode, proc.stderr, f"{shard}: refuses to unpickle posix.system")
    assert not canary.exists() and not (tmp_path / "hf").exists()


def test_an_rng_file_payload_is_refused_before_launch_and_by_the_worker(single, tmp_path):
    canary = tmp_path / "canary"
    step = copied(single, tmp_path / "rng")
    rng = step / "rng" / "rank_00000.pt"
    rng.write_bytes(payloads.torch_files(payloads.touch(canary))["stack-global-protocol-4"])
    payloads.rewrite_manifest(step)
    for module in ("framework", "tests.fixtures.resume_unchecked"):
        proc = resumed(step, tmp_path / module, module)
        one_error(proc.returncode, proc.stderr, f"{rng}: refuses pickle opcode FRAME in a file that names posix.system")
    assert not canary.exists()


def test_deepspeed_file_payloads_are_refused_by_resume_export_generate_and_the_workers(deepspeed, tmp_path, capsys,
                                                                                        compose_config):
    canary = tmp_path / "canary"
    files = payloads.torch_files(payloads.touch(canary))
    step = copied(deepspeed, tmp_path / "model_states")
    model_states = step / "state" / "mp_rank_00_model_states.pt"
    model_states.write_bytes(files["dotted-torch.os.system"])
    payloads.rewrite_manifest(step)
    said = resume_checked(compose_config, str(step), tmp_path / "run", *DEEPSPEED_Z2)
    assert len(said) == 1 and f"{model_states}: refuses to unpickle torch.os.system" in said[0], said
    for proc in (export_here(capsys, step, tmp_path / "hf"), generate_here(capsys, step)):
        one_error(proc.returncode, proc.stderr, f"{model_states}: refuses to unpickle torch.os.system")
    # rank 1's optimizer partition, which only rank 1 reads: the launching process's check, then rank 1 itself
    step = copied(deepspeed, tmp_path / "optim")
    optim = step / "state" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optim.write_bytes(files["global-protocol-2"])
    payloads.rewrite_manifest(step)
    said = resume_checked(compose_config, str(step), tmp_path / "run", *DEEPSPEED_Z2)
    assert len(said) == 1 and f"{optim}: refuses to unpickle posix.system" in said[0], said
    one_error(*(lambda p: (p.returncode, p.stderr))(export_here(capsys, step, tmp_path / "hf")),
              f"{optim}: refuses to unpickle posix.system")
    proc = resumed(step, tmp_path / "worker", "tests.fixtures.resume_unchecked", None, *DEEPSPEED_Z2)
    line = one_error(proc.returncode, proc.stderr, f"{optim}: refuses to unpickle posix.system", spawned=True)
    assert line.startswith(f"error: checkpoint.resume: {optim}: "), line     # the launcher's, for rank 1
    assert not canary.exists() and not (tmp_path / "hf").exists()


def test_a_qlora_checkpoint_resumes_and_exports_and_a_payload_in_its_nf4_weight_is_refused(qlora, tmp_path, capsys):
    """The NF4 base weights are tensor subclasses pickled whole: read weights only with that one class added.
    The single-process resume saves and loads without DCP's warning that it has no process group."""
    run_dir = tmp_path / "resumed"
    proc = resumed(qlora, run_dir, "framework", None, *QLORA, "trainer.max_steps=5", "checkpoint.enabled=true",
                   "trainer.progress_bar=true")
    check_ok(proc)
    assert [r["step"] for r in read_metrics(run_dir)] == [5]
    output = proc.stdout + proc.stderr
    assert "torch.distributed is disabled" not in output and "return func(*args, **kwargs)" not in output, output
    assert export_here(capsys, qlora, tmp_path / "hf").returncode == 0
    canary = tmp_path / "canary"
    step = copied(qlora, tmp_path / "nf4")
    weight = next(fqn for fqn in payloads.tensor_entries(step / "state") if fqn.endswith("wq.weight"))
    shard = payloads.plant_entry(step / "state", weight, payloads.torch_files(payloads.touch(canary))["global-protocol-2"])
    payloads.rewrite_manifest(step)
    one_error(*(lambda p: (p.returncode, p.stderr))(export_here(capsys, step, tmp_path / "hf2")),
              f"{shard}: refuses to unpickle posix.system")
    proc = resumed(step, tmp_path / "refused", "framework", None, *QLORA)
    one_error(proc.returncode, proc.stderr, f"{shard}: refuses to unpickle posix.system")
    assert not canary.exists()



def test_a_float8_lora_checkpoint_exports_the_values_it_stores(trained_run, tmp_path):
    """Its base weights are torchao Float8Tensors, read (weights only, that class added) into targets of their
    own kind: the export holds what torch's own DCP load puts into the model as the run stores it."""
    from omegaconf import OmegaConf

    from framework.export.read import read_dcp
    from framework.models import lora
    from framework.models.spec import spec_for
    step = trained_run(*FLOAT8_LORA) / "checkpoints" / STEP
    cfg = OmegaConf.load(step / "config.yaml")
    spec = spec_for(cfg.model)
    model = spec.build(cfg.model)
    names = lora.target_linears(model, spec.block_classes(model), cfg.lora.targets, spec.lora_skip())
    lora.apply_lora(model, names, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.dora)
    lora.store_base(model, "float8")
    stored = type(model.get_submodule(names[0]).weight)
    with torch.serialization.safe_globals([stored]):
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(step / "state"), no_dist=True)
    exported = read_dcp(str(step))
    assert stored.__name__ == "Float8Tensor" and names
    for name in names:
        assert torch.equal(exported[f"{name}.weight"], model.get_submodule(name).weight.dequantize().float()), name

# ---- in a bucket --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bucket(s3_env) -> str:
    """Made before any test captures stderr: the S3 server's request log binds the stream it first meets."""
    return make_bucket(s3_env, "payloads")


def _to_bucket(step: Path, url: str) -> None:
    for path in (p for p in step.rglob("*") if p.is_file()):
        storage.write_bytes(f"{url}/{path.relative_to(step)}", path.read_bytes())


def test_payloads_in_a_bucket_are_refused_by_resume_and_export(single, bucket, s3_here, tmp_path, capsys,
                                                               compose_config):
    canary = tmp_path / "canary"
    metadata = copied(single, tmp_path / "metadata")
    (metadata / "state" / ".metadata").write_bytes(
        payloads.plain_pickles(payloads.touch(canary))["stack-global-torch.os.system"])
    payloads.rewrite_manifest(metadata)
    _to_bucket(metadata, f"{bucket}/metadata/{STEP}")
    url = f"{bucket}/metadata/{STEP}"
    said = resume_checked(compose_config, url, tmp_path / "run")
    assert len(said) == 1 and f"{url}/state/.metadata: refuses to unpickle torch.os.system" in said[0], said
    one_error(*(lambda p: (p.returncode, p.stderr))(export_here(capsys, url, tmp_path / "hf")),
              f"{url}/state/.metadata: refuses to unpickle torch.os.system")

    entries = copied(single, tmp_path / "entries")
    files = payloads.torch_files(payloads.touch(canary))
    entry = payloads.byte_entries(entries / "state")[0]
    payloads.plant_entry(entries / "state", entry, files["global-protocol-2"])
    payloads.plant_entry(entries / "state", "model.output.weight", files["global-protocol-2"])
    payloads.rewrite_manifest(entries)
    url = f"{bucket}/entries/{STEP}"
    _to_bucket(entries, url)
    proc = resumed(url, tmp_path / "worker", "framework", s3_here)
    one_error(proc.returncode, proc.stderr, f"{url}/state/__0_0.distcp: ")
    one_error(*(lambda p: (p.returncode, p.stderr))(export_here(capsys, url, tmp_path / "hf")),
              f"{url}/state/__0_0.distcp: refuses to unpickle posix.system")
    assert not canary.exists() and not (tmp_path / "hf").exists()


def test_generation_builds_only_a_model_class_from_a_checkpoints_config(single, tmp_path, capsys):
    """generate builds only a framework model class from its checkpoint's config.yaml (framework/config/saved.py),
    whatever the manifest says: Hydra would call any _target_ (logging.FileHandler creates the file it is given:
    the canary)."""
    from omegaconf import OmegaConf
    canary = tmp_path / "canary"
    handler = {"_target_": "logging.FileHandler", "filename": str(canary)}
    for name, edit, says in (
            ("top", lambda cfg: cfg.update(model=handler), "model._target_: 'logging.FileHandler' is not one of the framework's classes"),
            ("nested", lambda cfg: cfg["model"].update(norm=handler), "model.norm._target_: Hydra's _target_ is refused here")):
        step = copied(single, tmp_path / name)
        cfg = OmegaConf.to_container(OmegaConf.load(step / "config.yaml"))
        edit(cfg)
        OmegaConf.save(OmegaConf.create(cfg), step / "config.yaml")
        payloads.rewrite_manifest(step)
        proc = generate_here(capsys, step)
        one_error(proc.returncode, proc.stderr, f"{step / 'config.yaml'}: {says}")
        assert not canary.exists(), name
