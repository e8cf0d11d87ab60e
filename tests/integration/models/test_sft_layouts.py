"""Packed SFT and LoRA end to end on the chats the package ships: the same losses under single, ddp, fsdp
and 3d (tp x pp, the documents handed along the pipeline); a LoRA run under fsdp whose adapter peft loads
onto the transformers model with our logits, whose merged export is base plus adapter, and whose optimizer
holds the adapters' states alone, as the planner says; a QLoRA run (NF4 base) whose export is the weights it
resumes with."""
import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from framework.data.assets import path as asset_path
from tests.harness.helpers import (FAST, assert_planned_model_states, check_ok, losses, max_rel_diff, read_metrics,
                                   run_framework)

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

STEPS = 4
LAYOUTS = {
    "single": ["parallel=single"],
    "ddp": ["parallel=ddp", "launcher.nproc_per_node=2"],
    "fsdp": ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2"],
    "3d": ["parallel=3d", "parallel.tp=2", "parallel.pp=2", "launcher.nproc_per_node=4"],
}
LORA = ["lora.enabled=true", "lora.rank=4", "lora.dora=true", "optimizer.lr=1e-2", "checkpoint.enabled=true"]
QLORA = ["parallel=single", "lora.enabled=true", "lora.rank=4", "lora.base_dtype=nf4", "optimizer.lr=1e-2",
         "checkpoint.enabled=true"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    chat = ["data=chat", f"data.path={asset_path('tiny_chat.jsonl')}", "data.tokenizer=bytes",
            "data.chat_template=chatml", f"data.cache_dir={root / 'cache'}", f"trainer.max_steps={STEPS}"]
    out = {}
    for name, layout in [*LAYOUTS.items(), ("lora", [*LAYOUTS["fsdp"], *LORA]), ("qlora", QLORA)]:
        out[name] = root / name
        check_ok(run_framework([*FAST, *chat, *layout], out[name]))
    return out


def test_packed_sft_has_the_same_losses_under_every_layout(runs):
    reference = read_metrics(runs["single"])
    assert len(reference) == STEPS and reference[-1]["loss"] < reference[0]["loss"]
    for name in ("ddp", "fsdp", "3d"):
        got = read_metrics(runs[name])
        assert max_rel_diff(losses(runs["single"]), losses(runs[name])) <= 1e-5, name
        assert max_rel_diff([r["grad_norm"] for r in reference], [r["grad_norm"] for r in got]) <= 1e-5, name
    config = OmegaConf.load(runs["single"] / "config.yaml")
    assert config.data.document_mask and config.model.vocab_size == 259     # bytes, end-of-text, ChatML's two


def _lora_model(step_dir, stored=False):
    """The run's model with its adapters, from the step dir: its weights as export reads them (fp32), or,
    `stored`, in the run's lora.base_dtype, loaded by DCP as a resume loads them."""
    from framework.export.read import read_dcp
    from framework.models import lora
    from framework.models.spec import spec_for
    cfg = OmegaConf.load(step_dir / "config.yaml")
    spec = spec_for(cfg.model)
    model = spec.build(cfg.model)
    names = lora.target_linears(model, spec.block_classes(model), cfg.lora.targets, spec.lora_skip())
    lora.apply_lora(model, names, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.dora)
    if not stored:
        model.load_state_dict(read_dcp(str(step_dir)))
        return model.eval()
    import torch.distributed.checkpoint as dcp
    lora.store_base(model, cfg.lora.base_dtype)
    with torch.serialization.safe_globals(lora.pickled_base_classes()):
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(step_dir / "state"), no_dist=True)
    return model.eval()


def test_peft_loads_the_exported_adapter_and_the_merged_export_is_base_plus_adapter(runs, tmp_path):
    from framework.export import export
    step = runs["lora"] / "checkpoints" / f"step_{STEPS:08d}"
    export(str(step), str(tmp_path / "hf"))
    export(str(step), str(tmp_path / "merged"), merge=True)
    config = json.loads((tmp_path / "hf" / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["use_dora"]
    tokens = torch.randint(0, 259, (2, 24))
    with torch.no_grad():
        ours = _lora_model(step)(tokens)
        base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
        adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "hf" / "adapter")).eval()
        assert float((adapted(input_ids=tokens).logits - ours).abs().max()) <= 1e-5
        merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
        assert float((merged.eval()(input_ids=tokens).logits - ours).abs().max()) <= 1e-5
    # the merged file is the base file plus the adapter's weight change (peft's own merge), tensor by tensor
    with torch.no_grad():
        folded = adapted.merge_and_unload().state_dict()
    merged_file, base_file = load_file(tmp_path / "merged" / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert merged_file.keys() == base_file.keys()
    changed = [k for k in merged_file if not torch.equal(merged_file[k], base_file[k])]
    assert changed and all(k.endswith(("_proj.weight",)) for k in changed)
    assert max(float((merged_file[k] - folded[k]).abs().max()) for k in merged_file) <= 1e-5


def test_a_qlora_export_is_the_nf4_weights_the_run_resumes_with_and_peft_loads_its_adapter(runs, tmp_path):
    from framework.export import export
    from framework.models import lora
    step = runs["qlora"] / "checkpoints" / f"step_{STEPS:08d}"
    export(str(step), str(tmp_path / "hf"))
    stored = _lora_model(step, stored=True)
    quantized = [n for n, m in stored.named_modules() if isinstance(m, lora.LoRALinear)]
    assert quantized and all(hasattr(stored.get_submodule(n).weight, "get_original_weight") for n in quantized)
    exported = _lora_model(step)
    for name in quantized:       # export reads the very values the NF4 weights stand for
        assert torch.equal(exported.get_submodule(name).weight, lora.dequantized(stored.get_submodule(name).weight,
                                                                                   torch.float32)), name
    tokens = torch.randint(0, 259, (2, 24))
    with torch.no_grad():
        base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
        adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "hf" / "adapter")).eval()
        assert float((adapted(input_ids=tokens).logits - stored(tokens)).abs().max()) <= 1e-5
    assert losses(runs["qlora"])[-1] < losses(runs["qlora"])[0]


def test_only_the_adapters_hold_optimizer_state_and_the_planner_agrees(runs):
    from framework.models import lora
    last = read_metrics(runs["lora"])[-1]
    adapters = lora.adapter_bytes(_lora_model(runs["lora"] / "checkpoints" / f"step_{STEPS:08d}"))
    # AdamW: two fp32 moments of every adapter element (sharded over the two ranks) and a step count per tensor
    moments = 2 * adapters // 2
    assert moments <= last["optim_state_bytes"] <= moments * 1.05
    assert last["grad_bytes"] == adapters // 2
    assert_planned_model_states(runs["lora"])
    assert losses(runs["lora"])[-1] < losses(runs["lora"])[0]


def test_adapters_on_a_transformers_model_load_into_peft(tmp_path):
    """model=hf: the adapters sit on transformers' own linears, and export names them as peft does."""
    from framework.export.adapter import write_adapter
    from framework.models import lora
    from framework.models.spec import spec_for
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "base")
    model_cfg = OmegaConf.create({"_target_": "framework.models.hf.HFCausalLM", "pretrained": str(tmp_path / "base"),
                                  "config": None})
    lora_cfg = OmegaConf.create({"rank": 4, "alpha": 8.0, "dropout": 0.0, "dora": False, "targets": []})
    spec = spec_for(model_cfg)
    model = spec.build(model_cfg).eval()
    names = lora.target_linears(model, spec.block_classes(model), [], spec.lora_skip())
    assert len(names) == 2 * 7          # q, k, v, o, gate, up, down in each block
    lora.apply_lora(model, names, 4, 8.0)
    with torch.no_grad():
        adapters = {n: p.normal_(std=0.1) for n, p in model.named_parameters() if lora.is_adapter(n)}
    write_adapter(str(tmp_path / "export"), spec, model_cfg, adapters, lora_cfg)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), dtype=torch.float32)
        adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "export" / "adapter")).eval()
        assert float((adapted(input_ids=tokens).logits - model(tokens)).abs().max()) <= 1e-5
