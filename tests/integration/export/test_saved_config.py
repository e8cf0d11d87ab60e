"""A checkpoint's config is data, never code (framework/config/saved.py): planted config.yaml files -- a model
class that truncates a file, one nested in the model's arguments, an interpolation that reads a secret from the
environment, a model=hf dir that brings code of its own -- through generate and export: nothing created or
truncated, no secret in any output, one `error:` line, exit 2. --trust-checkpoint-code lets a class of the
user's be imported, and nothing else. Generate applies a LoRA export's adapter/ (as the merged export computes);
a chat template that does not render is one line; export's files have the modes the user's umask gives."""
import json
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from framework import generate
from framework.export import load as load_module
from framework.config.saved import TRUST_FLAG
from tests.harness.helpers import FAST, check_ok, run_framework

SECRET_ENV = "FRAMEWORK_TEST_PLANTED_SECRET"
SECRET = f"planted{uuid.uuid4().hex}"
STEP = "step_00000004"
HF = "framework.models.hf.HFCausalLM"
PROMPT = "def "


@pytest.fixture(scope="module")
def lora_step(tmp_path_factory):
    """A LoRA run's last checkpoint (4 steps at a learning rate high enough for its adapters to matter)."""
    root = tmp_path_factory.mktemp("saved")
    args = [a for a in FAST if not a.startswith(("trainer.max_steps", "checkpoint.enabled", "optimizer.lr"))]
    check_ok(run_framework([*args, "trainer.max_steps=4", "checkpoint.enabled=true", "lora.enabled=true",
                            "lora.rank=4", "optimizer.lr=0.05"], root / "run"))
    return root / "run" / "checkpoints" / STEP


@pytest.fixture
def planted_env(tmp_path, monkeypatch):
    """A secret in the environment, a file to protect, a model dir whose code would mark that it ran."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    remote = tmp_path / "remote_code_model"
    remote.mkdir()
    ran = tmp_path / "remote_code_ran"
    (remote / "config.json").write_text(json.dumps({
        "model_type": "planted", "auto_map": {"AutoConfig": "configuration_planted.PlantedConfig",
                                              "AutoModelForCausalLM": "modeling_planted.PlantedModel"}}))
    for module in ("configuration_planted", "modeling_planted"):
        (remote / f"{module}.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    return victim, remote, ran


def planted(tmp_path: Path, step: Path, edit) -> Path:
    """A copy of the checkpoint whose config.yaml `edit` changed, its manifest rewritten by the attacker too."""
    copy = tmp_path / f"planted_{uuid.uuid4().hex[:6]}"
    shutil.copytree(step, copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text())
    edit(tree)
    (copy / "config.yaml").write_text(yaml.safe_dump(tree))
    meta = json.loads((copy / "meta.json").read_text())
    meta.pop("files", None)
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


def run_here(main, capsys, *args: str) -> subprocess.CompletedProcess:
    """A CLI's main in this process (what its command runs in a child, less the start-up)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], code, captured.out, captured.err)


def generate_here(capsys, path, *extra):
    return run_here(generate.main, capsys, path, "--prompt", PROMPT, "--max-new-tokens", "8", "--temperature", "0",
                    *extra)


def export_here(capsys, path, out, *extra):
    from framework.export.__main__ import main
    return run_here(main, capsys, path, out, *extra)


def assert_refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert all(w in lines[0] for w in words), (words, lines[0])
    assert SECRET not in proc.stdout + proc.stderr


def _model(**model):
    return lambda tree: tree.__setitem__("model", model)


def _set(section: str, key: str, value):
    return lambda tree: tree[section].__setitem__(key, value)


INTERPOLATION = "${oc.env:" + SECRET_ENV + "}"
CREATED = "created.log"     # a file a planted class would create
#: name -> (the edit, given the planted files; words of the one error line)
PLANTS = {
    "io.FileIO": (lambda victim, remote: _model(_target_="io.FileIO", file=str(victim), mode="w"),
                  ["config.yaml: model._target_: 'io.FileIO' is not one of the framework's classes", TRUST_FLAG]),
    "logging.FileHandler": (lambda victim, remote: _model(_target_="logging.FileHandler", mode="w",
                                                          filename=str(victim.with_name(CREATED))),
                            ["model._target_: 'logging.FileHandler'"]),
    "nested _target_": (lambda victim, remote: _set("model", "norm", {"_target_": "logging.FileHandler",
                                                                      "filename": str(victim.with_name(CREATED)),
                                                                      "mode": "w"}),
                        ["config.yaml: model.norm._target_: Hydra's _target_ is refused here"]),
    "secret in lora.dropout": (lambda victim, remote: _set("lora", "dropout", INTERPOLATION),
                               ["config.yaml: lora.dropout: holds an interpolation"]),
    "secret in data.tokenizer": (lambda victim, remote: _set("data", "tokenizer", INTERPOLATION),
                                 ["data.tokenizer: holds an interpolation"]),
    "secret in an unused section": (lambda victim, remote: _set("trainer", "sample_prompt", INTERPOLATION),
                                    ["trainer.sample_prompt: holds an interpolation"]),
    "model=hf asking for remote code": (lambda victim, remote: _model(_target_=HF, config=str(remote),
                                                                      trust_remote_code=True),
                                        ["model.trust_remote_code: Key 'trust_remote_code' not in 'HFModelConfig'"]),
    "model=hf dir with code": (lambda victim, remote: _model(_target_=HF, config=str(remote)),
                               ["model", "custom code"]),
    "a value of the wrong type": (lambda victim, remote: _set("lora", "rank", "many"),
                                  ["config.yaml: lora.rank: Value 'many' of type 'str' could not be converted"]),
    "a choice outside its set": (lambda victim, remote: _set("lora", "base_dtype", "float128"),
                                 ["lora.base_dtype: 'float128' is not one of float32|bfloat16|float8|nf4"]),
}


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_planted_config_is_refused_in_one_line_and_runs_nothing(name, lora_step, planted_env, tmp_path, capsys):
    victim, remote, ran = planted_env
    edit, words = PLANTS[name]
    step = planted(tmp_path, lora_step, edit(victim, remote))
    for extra in ([], [TRUST_FLAG]) if "_target_" in name or "hf" in name or "secret" in name else ([],):
        if extra and name in ("io.FileIO", "logging.FileHandler"):
            continue        # trusted, the checkpoint's classes are the user's to run: not these
        assert_refused(generate_here(capsys, step, *extra), *words)
        assert_refused(export_here(capsys, step, tmp_path / "out", *extra), *words)
    assert victim.read_text() == "precious" and not (tmp_path / CREATED).exists() and not ran.exists()
    assert not (tmp_path / "out").exists()


def test_a_class_of_the_users_is_imported_with_trust_only(lora_step, tmp_path, capsys):
    step = planted(tmp_path, lora_step, _set("model", "_target_", "tests.fixtures.models.TrustedLlama"))
    assert_refused(generate_here(capsys, step), "model._target_: 'tests.fixtures.models.TrustedLlama'", TRUST_FLAG)
    trusted = generate_here(capsys, step, TRUST_FLAG)
    check_ok(trusted)
    assert trusted.stdout == generate_here(capsys, lora_step).stdout and trusted.stdout.startswith(PROMPT)
    check_ok(export_here(capsys, step, tmp_path / "out", TRUST_FLAG))
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


def test_generate_applies_a_lora_exports_adapter_as_the_merged_export_computes(lora_step, tmp_path, capsys):
    check_ok(export_here(capsys, lora_step, tmp_path / "adapter_export"))
    check_ok(export_here(capsys, lora_step, tmp_path / "merged", "--merge"))
    outputs = {name: generate_here(capsys, tmp_path / name) for name in ("adapter_export", "merged")}
    for proc in outputs.values():
        check_ok(proc)
    assert outputs["adapter_export"].stdout == outputs["merged"].stdout      # token for token
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    adapted, _ = generate.load(str(tmp_path / "adapter_export"))
    merged, _ = generate.load(str(tmp_path / "merged"))
    own, _ = generate.load(str(lora_step))
    torch.testing.assert_close(_logits(adapted, tokens), _logits(merged, tokens), atol=1e-5, rtol=0)
    torch.testing.assert_close(_logits(adapted, tokens), _logits(own, tokens), atol=1e-5, rtol=0)
    shutil.rmtree(tmp_path / "adapter_export" / "adapter")          # the base alone, as generate read it before
    base, _ = generate.load(str(tmp_path / "adapter_export"))
    assert (_logits(base, tokens) - _logits(merged, tokens)).abs().max() > 1e-2     # the adapter matters here


@pytest.mark.parametrize("dora", [False, True])
def test_an_adapter_read_back_gives_the_adapted_models_logits(dora, tmp_path, compose_config):
    """Random adapters (DoRA's magnitudes too) on the tiny GQA Llama, whose q and k rows HF's layout reorders,
    written as export writes them and read back by generate: the same logits."""
    from framework.config.schema import LoraConfig
    from framework.export import _write
    from framework.export.adapter import split_state, write_adapter
    from framework.models import lora
    from framework.models.spec import model_dict, spec_for
    model_cfg = model_dict(compose_config(["model=tiny"]).model)
    spec = spec_for(model_cfg)
    torch.manual_seed(0)
    model = spec.build(model_cfg)
    lora.apply_lora(model, lora.target_linears(model, spec.block_classes(model), (), spec.lora_skip()), 4, 8.0,
                    dora=dora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.is_adapter(name):
                p.copy_(torch.randn_like(p) * (1.0 if name.endswith("magnitude") else 0.3))
    base, adapters = split_state({k: v.detach() for k, v in model.state_dict().items()})
    lora_cfg = OmegaConf.structured(LoraConfig(enabled=True, rank=4, alpha=8.0, dora=dora))
    _write(str(tmp_path / "out"), spec.to_hf(base, model_cfg), spec.hf_config(model_cfg),
           write_extra=lambda folder: write_adapter(folder, spec, model_cfg, adapters, lora_cfg))
    read_back, _ = load_module.from_export(str(tmp_path / "out"), False)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(read_back.eval(), tokens), _logits(model.eval(), tokens), atol=1e-5, rtol=0)


def test_an_adapter_generate_cannot_apply_is_one_line(lora_step, tmp_path, capsys):
    check_ok(export_here(capsys, lora_step, tmp_path / "out"))
    config = tmp_path / "out" / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "use_rslora": True}))
    assert_refused(generate_here(capsys, tmp_path / "out"), "adapter_config.json: use_rslora: True", "--merge")


@pytest.mark.parametrize("template,said", [
    ("{% for message in messages %}{{ message['content'] }", "TemplateSyntaxError"),
    ("{{ raise_exception('planted') }}", "TemplateError: planted"),
])
def test_a_chat_template_that_does_not_render_is_one_line(template, said, lora_step, tmp_path, capsys):
    step = tmp_path / "chat"
    shutil.copytree(lora_step, step)
    (step / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    assert_refused(generate_here(capsys, step), f"{step / 'tokenizer_config.json'}: chat_template: cannot be "
                                                f"rendered", said, "--raw")
    check_ok(generate_here(capsys, step, "--raw"))


def test_export_writes_its_files_with_the_modes_of_the_users_umask(lora_step, tmp_path, capsys):
    before = os.umask(0o022)
    try:
        check_ok(export_here(capsys, lora_step, tmp_path / "new"))
        (tmp_path / "forced").mkdir()
        (tmp_path / "forced" / "keep.txt").write_text("mine")
        check_ok(export_here(capsys, lora_step, tmp_path / "forced", "--force"))
    finally:
        os.umask(before)
    for out in (tmp_path / "new", tmp_path / "forced"):
        modes = {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
        assert modes == {"model.safetensors": 0o644, "config.json": 0o644, "tokenizer.json": 0o644,
                         "tokenizer_config.json": 0o644, "adapter": 0o755, "adapter/adapter_config.json": 0o644,
                         "adapter/adapter_model.safetensors": 0o644, **({"keep.txt": 0o644} if out.name == "forced"
                                                                        else {})}, modes
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
