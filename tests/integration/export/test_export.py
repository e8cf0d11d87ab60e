"""Portable weights on real checkpoints: export to the HF Llama layout (transformers gives our logits),
start any strategy from HF-layout weights (same first loss everywhere), refusal of bad input."""
import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from framework.checkpoint.names import read_meta
from framework.data.batches import GlobalBatchSampler, micro_batches, split_train_val
from framework.data.sources import load_tokens
from framework.export.read import READERS
from framework.models.llama import hf_adapter as hf_layout
from framework.models.llama import Llama
from framework.models.loss import cross_entropy
from tests.harness.helpers import DEEPSPEED_Z2, DEEPSPEED_Z3, FAST, check_ok, losses, run_framework

transformers = pytest.importorskip("transformers")

# tiny is GQA (4 query heads, 2 key/value heads): both q and k rows go through the rotary permutation.
LAYOUTS = {
    "fsdp_z3": ["parallel=fsdp", "zero=stage3"],
    "3d_tp2_dp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=2", "zero=stage3"],
    "deepspeed_z3": DEEPSPEED_Z3,
    "deepspeed_z2": DEEPSPEED_Z2,
}
STEPS = 8


@pytest.fixture(scope="module")
def runs(trained_run):
    """Layout name -> run dir of an 8-step run with checkpoints (shared with the checkpoint tests)."""
    return lambda name: trained_run(*LAYOUTS[name])


def step_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / f"step_{STEPS:08d}"


def export(ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_framework([str(ckpt), str(out), *extra], module="framework.export", timeout=120)


def our_model(ckpt: Path) -> Llama:
    model_cfg = OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml").model)
    return Llama(**{k: v for k, v in model_cfg.items() if k != "_target_"}).eval()


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """The fsdp checkpoint exported once: the weights the initial_load tests start from."""
    out = tmp_path_factory.mktemp("hf") / "fsdp_z3"
    proc = export(step_dir(runs("fsdp_z3")), out)
    assert proc.returncode == 0, proc.stderr
    return out


@torch.no_grad()
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_transformers_loads_the_export_with_our_logits(tmp_path, runs, name):
    ckpt = step_dir(runs(name))
    out = tmp_path / "hf"
    proc = export(ckpt, out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]

    reimported = our_model(ckpt)
    hf_layout.load_into(reimported, str(out))
    direct = our_model(ckpt)
    direct.load_state_dict(READERS[read_meta(str(ckpt))["format"]](str(ckpt)))
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert hf.config.num_key_value_heads < hf.config.num_attention_heads

    tokens = torch.randint(0, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    theirs = hf(tokens).logits
    torch.testing.assert_close(reimported(tokens), theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(direct(tokens), theirs, atol=1e-4, rtol=0)
    # The rotary permutation is not the identity here: q_proj rows really were reordered.
    assert not torch.equal(hf.model.layers[0].self_attn.q_proj.weight, direct.layers["0"].attention.wq.weight)


@torch.no_grad()
def first_step_loss(ckpt: Path, weights: Path) -> float:
    """The loss of the global batch of step 0 under `weights`, computed here in one process."""
    cfg = OmegaConf.load(ckpt / "config.yaml")
    model = our_model(ckpt)
    hf_layout.load_into(model, str(weights))
    train, _ = split_train_val(load_tokens(cfg.data), cfg.data.val_fraction)
    batch = GlobalBatchSampler(train, cfg.data.seq_len, cfg.trainer.global_batch_size, cfg.seed).local_batch(0, 0, 1)
    return float(torch.stack([cross_entropy(model(x), y) for x, y in micro_batches(batch, 2)]).mean())


def test_initial_load_gives_the_same_first_loss_under_every_layout(tmp_path, runs, exported):
    start = ["trainer.max_steps=1", "scheduler.warmup_steps=0", f"checkpoint.initial_load={exported}"]
    got = {}
    for name, layout in {"single": ["parallel=single"],
                         "fsdp_z3": ["parallel=fsdp", "zero=stage3"],
                         "3d_tp2_pp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=1"],
                         }.items():
        run_dir = tmp_path / name
        check_ok(run_framework([*FAST, *layout, *start], run_dir))
        got[name] = losses(run_dir)[0]
    expected = first_step_loss(step_dir(runs("fsdp_z3")), exported)
    fresh = losses(runs("fsdp_z3"))[0]      # the same seed and batch from the seeded init
    for name, loss in got.items():
        assert abs(loss - expected) <= 1e-5, (name, loss, expected)
        assert abs(loss - got["single"]) <= 1e-5, (name, loss, got["single"])
    assert abs(expected - fresh) > 1e-3, (expected, fresh)


def test_initial_load_that_does_not_fit_the_model_stops_before_work(tmp_path, exported):
    proc = run_framework([*FAST, f"checkpoint.initial_load={exported}", "model.dim=64"], tmp_path / "r")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "checkpoint.initial_load" in proc.stderr and "hidden_size=32" in proc.stderr and "64" in proc.stderr
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(exported / "config.json", no_weights)
    proc = run_framework([*FAST, f"checkpoint.initial_load={no_weights}"], tmp_path / "r2")
    assert proc.returncode == 2 and "model.safetensors" in proc.stderr
    assert not (tmp_path / "r2" / "metrics.jsonl").exists()


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]


def export_here(capsys, ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The CLI's main in this process (what `export` runs in a child, less its start-up)."""
    from framework.export.__main__ import main
    capsys.readouterr()
    code = main([str(ckpt), str(out), *extra])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


def _without_manifest(step: Path) -> None:
    meta = json.loads((step / "meta.json").read_text())
    meta.pop("files", None)
    (step / "meta.json").write_text(json.dumps(meta))


def test_export_refuses_bad_input_and_writes_nothing(tmp_path, runs, capsys):
    out, marker = tmp_path / "out", tmp_path / "pwned"
    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    _refused(export(not_a_checkpoint, out), "not a complete checkpoint")     # the CLI's own exit code and line
    assert not out.exists()

    dcp_ckpt = tmp_path / "dcp"
    shutil.copytree(step_dir(runs("fsdp_z3")), dcp_ckpt)
    (dcp_ckpt / "state" / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    _refused(export_here(capsys, dcp_ckpt, out), ".metadata is damaged")     # the manifest sees the change first
    _without_manifest(dcp_ckpt)     # an attacker writes the manifest too (or the checkpoint predates manifests)
    _refused(export_here(capsys, dcp_ckpt, out), "refuses to unpickle")

    ds_ckpt = tmp_path / "ds"
    shutil.copytree(step_dir(runs("deepspeed_z2")), ds_ckpt)
    optim = sorted((ds_ckpt / "state").glob("*optim_states.pt"))[0]
    torch.save({"optimizer_state_dict": _Exploit(marker)}, optim)
    _without_manifest(ds_ckpt)
    _refused(export_here(capsys, ds_ckpt, out), "refuses to unpickle")
    assert not marker.exists() and not out.exists()

    other_model = tmp_path / "other_model"
    shutil.copytree(step_dir(runs("fsdp_z3")), other_model)
    cfg = OmegaConf.load(other_model / "config.yaml")
    cfg.model._target_ = "tests.fixtures.models.NaNAtStep"
    OmegaConf.save(cfg, other_model / "config.yaml")
    _refused(export_here(capsys, other_model, out), "config.yaml is damaged")
    _without_manifest(other_model)
    _refused(export_here(capsys, other_model, out), "model._target_")
    assert not out.exists()

    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for stale in ("model.safetensors.index.json", "model-00001-of-00002.safetensors"):   # an older sharded model
        (out / stale).write_text("old")
    _refused(export_here(capsys, step_dir(runs("fsdp_z3")), out), "--force")
    assert len(os.listdir(out)) == 3
    assert export_here(capsys, step_dir(runs("fsdp_z3")), out, "--force").returncode == 0
    assert sorted(os.listdir(out)) == ["config.json", "keep.txt", "model.safetensors", "tokenizer.json",
                                       "tokenizer_config.json"]


def test_export_keeps_the_tokenizers_own_special_tokens(tmp_path):
    """bos/eos/unk as the tokenizer defines them (was: all three set to the end-of-text token)."""
    from framework.data.tokenizer import byte_tokenizer, write_hf_files
    from tests.integration.data.test_prepare import llama_style_tokenizer
    for name in ("llama", "bytes"):
        (tmp_path / name).mkdir()
    write_hf_files(llama_style_tokenizer(), str(tmp_path / "llama"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "llama")
    assert (tok.bos_token, tok.eos_token, tok.unk_token) == ("<s>", "</s>", "<unk>")
    assert tok("third").input_ids == [0, 5]
    write_hf_files(byte_tokenizer(), str(tmp_path / "bytes"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "bytes")
    assert (tok.bos_token, tok.eos_token, tok.unk_token) == (None, "<|endoftext|>", None)


def test_export_fills_missing_special_token_ids_and_keeps_the_models_own():
    from framework.export import _fill_special_token_ids
    from tests.integration.data.test_prepare import llama_style_tokenizer
    config = {"vocab_size": 300, "eos_token_id": 7}
    _fill_special_token_ids(config, llama_style_tokenizer())
    assert config == {"vocab_size": 300, "eos_token_id": 7, "bos_token_id": 0}
    config = {"vocab_size": 300}
    _fill_special_token_ids(config, llama_style_tokenizer())
    assert config == {"vocab_size": 300, "eos_token_id": 1, "bos_token_id": 0}
