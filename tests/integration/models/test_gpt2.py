"""The GPT-2 family (LayerNorm with bias, learned positions, GELU MLP, biases everywhere, tied head):
the single-process run (losses, grad norms, final weights) under ddp, fsdp, deepspeed and 3d, tied
embeddings kept correct across pipeline stages, exact and resharded resume, and an export that
transformers' GPT2LMHeadModel loads with our logits."""
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from framework.checkpoint.names import read_meta
from framework.export.read import READERS
from framework.models.spec import spec_for
from tests.conftest import CHECKPOINTED
from tests.harness.helpers import FAST, SAVE_LAST, assert_planned_model_states, check_ok, losses, run_framework
from tests.harness.parity import assert_parity

transformers = pytest.importorskip("transformers")

GPT2 = [*(a for a in FAST if a != "model=tiny"), "model=gpt2_tiny", *CHECKPOINTED]
LAYOUTS = {
    "ddp": ["parallel=ddp"],
    "fsdp_z3": ["parallel=fsdp", "zero=stage3"],
    "deepspeed_z2": ["parallel=deepspeed", "zero=stage2"],
    "3d_tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"],
    "3d_pp2_1f1b": ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=1",
                    "parallel.pp_schedule=1F1B"],
    "3d_2x2x2": ["parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=2", "zero=stage3"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Layout name -> run dir of its 8-step run (checkpoints at 4 and 8), trained once."""
    root, done = tmp_path_factory.mktemp("gpt2"), {}

    def get(name: str) -> Path:
        if name not in done:
            check_ok(run_framework([*GPT2, *LAYOUTS.get(name, ["parallel=single"])], root / name))
            done[name] = root / name
        return done[name]
    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_matches_single(runs, name):
    """Loss, grad norm (the tied weight's gradient counts once, however the stages split it), final weights."""
    assert len(losses(runs(name))) == 8
    assert_parity(runs(name), runs("single"))
    assert_planned_model_states(runs(name))


def test_pipeline_resume_is_exact_and_reshards_to_single(tmp_path, runs):
    """The pp2 checkpoint holds the tied weight twice (wte on stage 0, lm_head on stage 1): it resumes
    pp2 exactly and a single process (one tied parameter) on the same curve."""
    pp2 = runs("3d_pp2_1f1b")
    step_4 = pp2 / "checkpoints" / "step_00000004"
    check_ok(run_framework([*GPT2, *LAYOUTS["3d_pp2_1f1b"], f"checkpoint.resume={step_4}"], tmp_path / "pp2"))
    assert assert_parity(tmp_path / "pp2", pp2)["kind"] == "fp32"
    check_ok(run_framework([*GPT2, "parallel=single", f"checkpoint.resume={step_4}"], tmp_path / "single"))
    assert_parity(tmp_path / "single", runs("single"))


@torch.no_grad()
def test_export_loads_in_transformers_with_our_logits_and_loads_back(tmp_path, runs):
    ckpt = runs("fsdp_z3") / "checkpoints" / "step_00000008"
    out = tmp_path / "hf"
    proc = run_framework([str(ckpt), str(out)], module="framework.export", timeout=120)
    assert proc.returncode == 0, proc.stderr
    cfg = OmegaConf.load(ckpt / "config.yaml")
    spec = spec_for(cfg.model)
    ours = spec.build(cfg.model).eval()
    ours.load_state_dict(READERS[read_meta(str(ckpt))["format"]](str(ckpt)))
    hf = transformers.GPT2LMHeadModel.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(tokens), hf(tokens).logits, atol=1e-4, rtol=0)
    # checkpoint.initial_load reads the export back: every parameter as trained
    weights = spec.hf_weights(str(out), cfg.model)
    assert not weights.shape_errors()
    for name, p in ours.named_parameters():
        torch.testing.assert_close(weights.full(name), p, atol=0, rtol=0)
    from framework import generate
    model, tok = generate.load(str(out))
    assert len(generate.sample(model, tok.encode("The ").ids, 5, seed=0)) == 5


def test_llama_with_tied_embeddings_splits_the_same_way(tmp_path):
    """The tied-weight mechanism is the spec's, not GPT-2's: our Llama with tie_embeddings=true under
    tp2 x pp2 gives the single-process losses and grad norms too."""
    tied = [*FAST, SAVE_LAST, "model.tie_embeddings=true", "trainer.max_steps=6"]
    check_ok(run_framework([*tied, "parallel=single"], tmp_path / "single"))
    check_ok(run_framework([*tied, "parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=1"],
                           tmp_path / "3d"))
    assert_parity(tmp_path / "3d", tmp_path / "single")
