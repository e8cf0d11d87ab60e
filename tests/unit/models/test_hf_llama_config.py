"""Hugging Face Llama weights in and out lose nothing (in-process, no process group): sharded checkpoints
with transformers' default rms_norm_eps and Llama 3.1 rope scaling give transformers' logits after
checkpoint.initial_load's config adoption and after export; a contradiction or an unknown RoPE is one error."""
import json

import pytest
import torch

from framework.errors import ConfigError
from framework.checkpoint.rules import take_initial_load_values, validate_initial_load
from framework.models.llama import hf_adapter
from framework.models.llama.model import llama3_frequencies
from framework.models.spec import spec_for

transformers = pytest.importorskip("transformers")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
TOKENS = torch.randint(0, 256, (2, 200), generator=torch.Generator().manual_seed(0))


def _hf_config(**extra):
    """model=tiny's shapes, and otherwise transformers' own defaults (rms_norm_eps=1e-6)."""
    return transformers.LlamaConfig(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, **extra)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (dir of a sharded save_pretrained, the transformers model)."""
    root, out = tmp_path_factory.mktemp("hf_llama"), {}
    configs = {"defaults": _hf_config(),
               "llama3_rope": _hf_config(rope_parameters={**LLAMA3, "rope_theta": 500000.0}),
               "tied": _hf_config(tie_word_embeddings=True)}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        model.save_pretrained(root / name, max_shard_size="40KB")
        out[name] = root / name, model
    return out


def _imported(compose_config, path, *overrides, explicit=()):
    cfg = compose_config(["model=tiny", f"checkpoint.initial_load={path}", *overrides])
    take_initial_load_values(cfg, set(explicit))
    validate_initial_load(cfg, str(path))
    model = spec_for(cfg.model).build(cfg.model).eval()
    hf_adapter.load_into(model, str(path))
    return cfg, model


def test_fixture_checkpoints_are_sharded(checkpoints):
    path, _ = checkpoints["defaults"]
    assert len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert not (path / "model.safetensors").exists() and len(list(path.glob("model-*-of-*.safetensors"))) > 1


@pytest.mark.parametrize("name", ["defaults", "llama3_rope", "tied"])
def test_import_and_export_give_transformers_logits(compose_config, checkpoints, tmp_path, name):
    path, reference = checkpoints[name]
    cfg, ours = _imported(compose_config, path)
    with torch.no_grad():
        expected = reference(input_ids=TOKENS).logits
        torch.testing.assert_close(ours(TOKENS), expected, rtol=1e-4, atol=1e-4)
    # export: our state in the HF layout, loaded back by transformers
    spec = spec_for(cfg.model)
    out = tmp_path / "export"
    out.mkdir()
    from safetensors.torch import save_file
    save_file(spec.to_hf(ours.state_dict(), cfg.model), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(spec.hf_config(cfg.model)))
    back = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=TOKENS).logits, expected, rtol=1e-4, atol=1e-4)


def test_the_checkpoints_function_keys_are_adopted(compose_config, checkpoints):
    cfg, _ = _imported(compose_config, checkpoints["llama3_rope"][0])
    assert cfg.model.norm_eps == 1e-6 and cfg.model.rope_theta == 500000.0
    assert dict(cfg.model.rope_scaling) == LLAMA3
    assert _imported(compose_config, checkpoints["tied"][0])[0].model.tie_embeddings is True


def test_llama3_frequencies_are_transformers(checkpoints):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig(hidden_size=512, num_attention_heads=4,
                                      rope_parameters={**LLAMA3, "original_max_position_embeddings": 8192,
                                                       "rope_theta": 500000.0})
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = 128
    base = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ours = llama3_frequencies(base, {**LLAMA3, "original_max_position_embeddings": 8192})
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (ours < base).any() and (ours == base).any()     # some bands stretched, some kept


def test_a_command_line_value_contradicting_the_checkpoint_is_refused_naming_both(compose_config, checkpoints):
    path, _ = checkpoints["defaults"]
    with pytest.raises(ConfigError) as e:
        _imported(compose_config, path, "model.norm_eps=1e-5", explicit={"model.norm_eps"})
    assert e.value.key == "model.norm_eps" and "1e-05" in str(e.value) and "1e-06" in str(e.value)
    cfg, _ = _imported(compose_config, path, "model.norm_eps=1e-6", explicit={"model.norm_eps"})   # agreeing
    assert cfg.model.norm_eps == 1e-6
    with pytest.raises(ConfigError, match="model.rope_scaling: .*'factor': 4.*'factor': 8.0"):
        _imported(compose_config, checkpoints["llama3_rope"][0], "model.rope_scaling.rope_type=llama3",
                  "model.rope_scaling.factor=4", explicit={"model.rope_scaling.factor", "model.rope_scaling.rope_type"})


@pytest.mark.parametrize("change,words", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, "'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act=gelu"),
    ({"attention_bias": True}, "attention_bias=True"),
])
def test_what_this_llama_cannot_compute_is_refused_in_one_line(compose_config, checkpoints, tmp_path, change, words):
    import shutil
    path = tmp_path / "changed"
    shutil.copytree(checkpoints["defaults"][0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ConfigError) as e:
        _imported(compose_config, path)
    assert e.value.key == "checkpoint.initial_load" and words in str(e.value) and "\n" not in str(e.value)


def test_model_rope_scaling_from_the_command_line(compose_config):
    cfg = compose_config(["model=tiny", "model.rope_scaling={rope_type:linear,factor:2.0}"])
    with pytest.raises(ConfigError, match="'linear' is not implemented"):
        spec_for(cfg.model).validate(cfg)
    cfg = compose_config(["model=tiny", "model.rope_scaling={rope_type:llama3,factor:8,low_freq_factor:1,"
                                        "high_freq_factor:4,original_max_position_embeddings:32}"])
    spec_for(cfg.model).validate(cfg)
    assert spec_for(cfg.model).build(cfg.model).args.rope_scaling["factor"] == 8
