"""model=hf: transformers causal LMs from local files train under single, fsdp x2 and deepspeed x2 (ZeRO-3)
with the losses of a plain transformers training loop on the same batches (the Llama from sharded
safetensors files, which sharded layouts read each rank's shards from); the HF Llama and our Llama
loaded from the same weights agree; resume is exact, with dropout too (the RNG state comes back); the export
loads back with from_pretrained."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from framework.checkpoint.names import read_meta
from framework.data.batches import build_samplers
from framework.export.read import READERS
from tests.conftest import CHECKPOINTED
from tests.harness.helpers import FAST, REPO, check_ok, losses, read_metrics, run_framework
from tests.harness.parity import assert_parity, assert_series_parity

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True

transformers = pytest.importorskip("transformers")

CONSTANT_LR = ["scheduler=constant", "scheduler.warmup_steps=0"]     # what the plain loop below does
BASE = [*(a for a in FAST if a != "model=tiny"), "model=hf", *CONSTANT_LR, *CHECKPOINTED]
LAYOUTS = {"single": ["parallel=single"], "fsdp": ["parallel=fsdp", "zero=stage3"],
           "deepspeed": ["parallel=deepspeed", "zero=stage3"]}
#: a GPT-2 with dropout (0.1): every training step draws its masks from torch's RNG, so only a resume that
#: restores the RNG state continues the curve exactly
DROPOUT = [*BASE, f"model.config={REPO / 'tests' / 'fixtures' / 'hf_dropout' / 'config.json'}", "parallel=single"]


def _configs():
    # the shapes of model=tiny (so our Llama can load the same weights), no dropout
    llama = transformers.LlamaConfig(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                                     rms_norm_eps=1e-5, tie_word_embeddings=False)
    gpt2 = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=256, n_positions=256,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return {"llama": (transformers.LlamaForCausalLM, llama), "gpt2": (transformers.GPT2LMHeadModel, gpt2)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Architecture -> a local dir with config.json + safetensors (the Llama's in several files, as
    transformers shards a large model), made from a small config."""
    root, out = tmp_path_factory.mktemp("hf_models"), {}
    for arch, (cls, config) in _configs().items():
        torch.manual_seed(0)
        cls(config).save_pretrained(root / arch, max_shard_size="40KB" if arch == "llama" else "5GB")
        out[arch] = root / arch
    return out


# Llama from its saved weights; GPT-2 from its config.json alone: a fresh init from the seed, which must
# be the same under every layout (the plain loop below makes it with the seed too).
SOURCE = {"llama": lambda d: f"model.pretrained={d}", "gpt2": lambda d: f"model.config={d / 'config.json'}"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, saved):
    root, done = tmp_path_factory.mktemp("hf_runs"), {}

    def get(arch: str, layout: str) -> Path:
        if (arch, layout) not in done:
            run_dir = root / f"{arch}_{layout}"
            check_ok(run_framework([*BASE, SOURCE[arch](saved[arch]), *LAYOUTS[layout]], run_dir))
            done[arch, layout] = run_dir
        return done[arch, layout]
    return get


def plain_transformers_loop(model_dir: Path, run_dir: Path, fresh: bool) -> dict[str, list[float]]:
    """What a user's own loop gives: from_pretrained (or from_config after seeding torch), AdamW (decay on
    matrices only), clip 1.0, the same global batches the framework drew (its sampler, in one process)."""
    from omegaconf import OmegaConf
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml") if (run_dir / ".hydra").exists() else None
    cfg = cfg or OmegaConf.load(next(run_dir.glob("checkpoints/*/config.yaml")))
    if fresh:
        torch.manual_seed(cfg.seed)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(model_dir / "config.json"), dtype=torch.float32).train()
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optimizer
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=o.lr, betas=tuple(o.betas), eps=o.eps)
    sampler, _ = build_samplers(cfg.data, cfg.trainer.global_batch_size, cfg.seed, with_val=False)
    out = {"loss": [], "grad_norm": []}
    for step in range(cfg.trainer.max_steps):
        batch = sampler.local_batch(step, 0, 1)
        x, y = batch[:, :-1], batch[:, 1:]
        loss = F.cross_entropy(model(input_ids=x).logits.flatten(0, -2).float(), y.flatten())
        loss.backward()
        out["grad_norm"].append(torch.nn.utils.clip_grad_norm_(params, cfg.trainer.grad_clip).item())
        opt.step()
        opt.zero_grad()
        out["loss"].append(loss.item())
    return out


@pytest.fixture(scope="module")
def plain(runs, saved):
    done = {}

    def get(arch: str) -> dict[str, list[float]]:
        if arch not in done:
            done[arch] = plain_transformers_loop(saved[arch], runs(arch, "single"), fresh=arch == "gpt2")
        return done[arch]
    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_matches_a_plain_transformers_loop(runs, plain, arch, layout):
    """single against the plain loop; the other layouts against single (loss, grad norm, final weights)."""
    got = read_metrics(runs(arch, layout))
    assert len(got) == 8
    if layout == "single":
        for key in ("loss", "grad_norm"):
            assert_series_parity(key, [r[key] for r in got], plain(arch)[key], "fp32-implementation")
    else:
        assert_parity(runs(arch, layout), runs(arch, "single"))


def test_hf_llama_and_our_llama_from_the_same_weights_agree(tmp_path, runs, saved):
    ours = tmp_path / "ours"
    check_ok(run_framework([*FAST, *CONSTANT_LR, f"checkpoint.initial_load={saved['llama']}"], ours))
    assert_parity(ours, runs("llama", "single"), kind="fp32-implementation")


def test_resume_is_exact_and_the_export_loads_with_from_pretrained(tmp_path, runs, saved):
    run_dir = runs("llama", "fsdp")
    step_4 = run_dir / "checkpoints" / "step_00000004"
    check_ok(run_framework([*BASE, f"model.pretrained={saved['llama']}", *LAYOUTS["fsdp"],
                            f"checkpoint.resume={step_4}"], tmp_path / "resumed"))
    assert len(losses(tmp_path / "resumed")) == 4
    assert_parity(tmp_path / "resumed", run_dir)

    ckpt, out = run_dir / "checkpoints" / "step_00000008", tmp_path / "hf"
    proc = run_framework([str(ckpt), str(out)], module="framework.export", timeout=120)
    assert proc.returncode == 0, proc.stderr
    state = READERS[read_meta(str(ckpt))["format"]](str(ckpt))
    trained = transformers.AutoModelForCausalLM.from_pretrained(saved["llama"], dtype=torch.float32).eval()
    trained.load_state_dict({k[len("model."):]: v for k, v in state.items()})
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, trained(tokens).logits, atol=1e-5, rtol=0)
        assert not torch.allclose(exported(tokens).logits,
                                  transformers.AutoModelForCausalLM.from_pretrained(saved["llama"])(tokens).logits)


def test_resume_with_dropout_is_exact(tmp_path, trained_run):
    full = trained_run(*DROPOUT, base=())
    resumed = tmp_path / "resumed"
    check_ok(run_framework([*DROPOUT, f"checkpoint.resume={full / 'checkpoints' / 'step_00000004'}"], resumed))
    assert len(losses(resumed)) == 4
    assert_parity(resumed, full)


def test_a_pretrained_model_is_read_by_name_into_a_meta_skeleton(saved, monkeypatch):
    """What fsdp and deepspeed stage3 do with model.pretrained: no rank builds the full model; each
    allocates its shards and reads only their slices of the safetensors files (RoPE buffers stay computed)."""
    from omegaconf import OmegaConf

    from framework.models.factory import ModelFactory
    from framework.models.hf.spec import _Weights
    assert len(list(saved["llama"].glob("model-*-of-*.safetensors"))) > 1
    cfg = OmegaConf.create({"model": {"_target_": "framework.models.hf.HFCausalLM", "pretrained": str(saved["llama"]),
                                      "config": None}, "seed": 0, "checkpoint": {"initial_load": None},
                           "precision": {"store_dtype": "float32"}})
    factory = ModelFactory(cfg)
    model = factory.meta()
    assert factory.can_materialize and all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    reference = transformers.AutoModelForCausalLM.from_pretrained(saved["llama"], dtype=torch.float32).eval()
    theirs = dict(reference.named_parameters())
    monkeypatch.setattr(_Weights, "full", lambda *a: pytest.fail("read a whole tensor for one shard"))
    for name, p in model.named_parameters():
        second_half = (slice(p.shape[0] // 2, p.shape[0]),)
        expected = theirs[name[len("model."):]][second_half]
        assert torch.equal(factory.full_parameter(name, p.shape, second_half), expected)
    monkeypatch.undo()
    factory.materialize(model, torch.device("cpu"))
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.eval()(tokens), reference(tokens).logits)


def test_bad_model_dirs_stop_before_work(tmp_path, saved):
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((saved["llama"] / "config.json").read_text())
    for args, words in (([], "exactly one of"), ([f"model.pretrained={no_weights}"], "model.safetensors"),
                        ([f"model.pretrained={saved['llama']}", "parallel=3d", "parallel.tp=2"], "parallel.tp")):
        proc = run_framework([*BASE, *args], tmp_path / "r")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert any(w in proc.stderr for w in words.split("|")), proc.stderr


def test_the_planner_plans_a_pretrained_model_from_its_config(saved):
    # The planner builds on the meta device, where transformers refuses from_pretrained (on a GPU the
    # job printed "warning: no memory plan (InstantiationException ...)").
    from hydra import compose, initialize_config_dir

    from framework.config.paths import CONFIG_DIR
    from tests.harness.helpers import derive_and_validate
    from framework.compose.config_store import register_configs
    from framework.plan.check import refuse_if_it_cannot_fit
    from framework.plan.layout import layout_of
    from framework.plan.shapes import rank_parameters
    from framework.strategies.registry import strategy_class

    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=[*BASE, f"model.pretrained={saved['llama']}", *LAYOUTS["fsdp"],
                                           "planner.device=h100"])
    derive_and_validate(cfg, 2, strategy_class("fsdp"))
    assert refuse_if_it_cannot_fit(cfg, 2, lambda c: None).fits
    planned = {p.name: p.full for p in rank_parameters(cfg, layout_of(cfg, 2))}
    real = transformers.LlamaForCausalLM.from_pretrained(saved["llama"])
    assert sorted(planned.values()) == sorted(tuple(p.shape) for p in real.parameters())
