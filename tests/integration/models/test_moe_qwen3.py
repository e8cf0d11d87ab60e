"""The MoE family in Qwen3-MoE's layout: with model.qk_norm its export loads in transformers'
Qwen3MoeForCausalLM with our logits and reads back, checkpoint.initial_load starts from it (taking
qk_norm and norm_topk_prob from config.json), and what Qwen3-MoE cannot compute is refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from framework.checkpoint.rules import take_initial_load_values, validate_initial_load
from framework.data.batches import GlobalBatchSampler, micro_batches, split_train_val
from framework.data.sources import load_tokens
from framework.errors import ConfigError
from framework.models.hf_files import LayoutError
from framework.models.loss import cross_entropy
from framework.models.moe.spec import SPEC
from framework.models.spec import spec_for_hf
from tests.harness.helpers import FAST, REPO, check_ok, read_metrics, run_framework

# Qwen3's own choices: head_dim apart from dim / n_heads, the top-k weights not renormalised
QWEN3 = {"qk_norm": True, "attn_head_dim": 16, "norm_topk_prob": False}


def model_cfg(**overrides):
    cfg = OmegaConf.load(REPO / "conf" / "model" / "moe_tiny.yaml")
    cfg.pop("defaults")
    return OmegaConf.merge(OmegaConf.structured(SPEC.config_schema()), cfg, overrides)


def random_model(cfg):
    """Every weight random, norms included: a norm left at one would hide a wrong q/k-norm reordering."""
    model = SPEC.build(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("expert_bias"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen) if name.endswith("norm.weight")
                        else 0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    cfg = model_cfg(**QWEN3)
    model = random_model(cfg)
    out = tmp_path_factory.mktemp("qwen3_moe")
    save_file(SPEC.to_hf(model.state_dict(), cfg), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(SPEC.hf_config(cfg)))
    return out, model


def test_export_gives_our_logits_in_qwen3_moe_and_reads_back(exported):
    transformers = pytest.importorskip("transformers")
    path, ours = exported
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen3_moe"
    hf = transformers.Qwen3MoeForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    back = SPEC.build(model_cfg(**QWEN3)).eval()
    weights = SPEC.hf_weights(str(path), model_cfg(**QWEN3))
    assert weights.shape_errors() == []
    with torch.no_grad():
        for n, p in back.named_parameters():
            p.copy_(weights.full(n))
    tokens = torch.randint(0, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(tokens).logits
        torch.testing.assert_close(ours(tokens), theirs, atol=1e-4, rtol=0)
        torch.testing.assert_close(back(tokens), theirs, atol=1e-4, rtol=0)


def test_initial_load_from_qwen3_moe_takes_its_weights_and_qk_norm(tmp_path, exported):
    path, ours = exported
    run_dir = tmp_path / "init"
    check_ok(run_framework([*FAST, "model=moe_tiny", "model.attn_head_dim=16", "trainer.max_steps=1",
                            "scheduler.warmup_steps=0", f"checkpoint.initial_load={path}"], run_dir))
    cfg = OmegaConf.load(run_dir / "config.yaml")
    assert cfg.model.qk_norm is True and cfg.model.norm_topk_prob is False   # adopted from config.json
    train, _ = split_train_val(load_tokens(cfg.data), cfg.data.val_fraction)
    batch = GlobalBatchSampler(train, cfg.data.seq_len, cfg.trainer.global_batch_size, cfg.seed).local_batch(0, 0, 1)
    with torch.no_grad():
        expected = float(torch.stack([cross_entropy(ours(x), y)
                                      for x, y in micro_batches(batch, cfg.trainer.micro_batch_size)]).mean())
    assert abs(read_metrics(run_dir)[0]["loss"] - expected) <= 1e-5


@pytest.mark.parametrize("overrides, fragment", [
    ({"score_func": "sigmoid"}, "score_func=sigmoid (Qwen3-MoE: softmax)"),
    ({"shared_ffn_dim": 8}, "Qwen3-MoE has no shared expert"),
    ({"balance": "bias"}, "Qwen3-MoE has no routing bias"),
])
def test_what_qwen3_moe_cannot_compute_is_refused(overrides, fragment):
    cfg = model_cfg(**QWEN3, **overrides)
    with pytest.raises(LayoutError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        SPEC.to_hf(SPEC.build(cfg).state_dict(), cfg)


def test_off_qk_norm_keeps_llama_parameter_names():
    names = {n for n, _ in SPEC.build(model_cfg()).named_parameters()}
    assert not any("q_norm" in n or "k_norm" in n for n in names)
    assert {n for n in names if ".attention." in n} == {f"layers.{i}.attention.w{x}.weight"
                                                         for i in range(2) for x in "qkvo"}


@pytest.mark.parametrize("change, words", [
    ({"mlp_only_layers": [1]}, "mlp_only_layers=[1]"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ({"use_sliding_window": True}, "use_sliding_window=True"),
])
def test_a_qwen3_moe_config_this_decoder_cannot_compute_is_refused_in_one_line(compose_config, exported, tmp_path,
                                                                              change, words):
    path, _ = exported
    changed = tmp_path / "changed"
    shutil.copytree(path, changed)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, **change}))
    cfg = compose_config(["model=moe_tiny", "model.attn_head_dim=16", f"checkpoint.initial_load={changed}"])
    take_initial_load_values(cfg)
    with pytest.raises(ConfigError) as e:
        validate_initial_load(cfg, str(changed))
    assert e.value.key == "checkpoint.initial_load" and words in str(e.value) and "\n" not in str(e.value)


def test_a_mixtral_config_into_a_qk_norm_model_is_refused(compose_config, exported, tmp_path):
    path, _ = exported
    changed = tmp_path / "mixtral"
    shutil.copytree(path, changed)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "model_type": "mixtral"}))
    cfg = compose_config(["model=moe_tiny", "model.attn_head_dim=16", "model.qk_norm=true",
                          f"checkpoint.initial_load={changed}"])
    with pytest.raises(ConfigError) as e:
        take_initial_load_values(cfg, {"model.qk_norm"})
        validate_initial_load(cfg, str(changed))
    assert e.value.key == "model.qk_norm" and "contradicts mixtral q/k norms=False" in str(e.value)


def test_qwen3_moe_exports_are_found_for_generation_with_their_shapes():
    cfg = model_cfg(**QWEN3)
    hf = SPEC.hf_config(cfg)
    assert spec_for_hf(hf) is SPEC
    back = model_cfg(**{k: v for k, v in SPEC.model_cfg_from_hf(hf).items() if k != "_target_"})
    assert SPEC.num_params(back) == SPEC.num_params(cfg) and back.qk_norm and not back.norm_topk_prob


def test_qk_norm_under_tensor_parallelism_is_refused(compose_config):
    cfg = compose_config(["model=qwen3_30b_a3b", "parallel=3d", "parallel.tp=2", "parallel.pp=1"])
    with pytest.raises(ConfigError) as e:
        SPEC.validate_layout(cfg, 2, 1)
    assert e.value.key == "model.qk_norm" and "parallel.tp=2" in str(e.value)
