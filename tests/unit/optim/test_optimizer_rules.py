"""What the optimizer and the schedule refuse at admission: one `error:` line naming the key, before any work."""
from __future__ import annotations

import pytest

from tests.harness.servers import refused

TINY = ["model=tiny", "data.seq_len=32", "device=cpu"]

CASES = {
    "muon under deepspeed": (
        ["parallel=deepspeed", "zero=stage2", "optimizer=muon"],
        "error: optimizer: framework.optim.muon.MuonWithAdamW is refused under parallel=deepspeed: Muon "
        "orthogonalises whole matrices"),
    "a pattern that matches nothing": (
        ["+optimizer.groups=[{pattern: 'lm_head'}]"],
        "error: optimizer.groups[0].pattern: 'lm_head' matches no parameter of the model (names such as "
        "tok_embeddings.weight"),
    "a pattern that is no regex": (
        ["+optimizer.groups=[{pattern: 'out(put'}]"], "error: optimizer.groups[0].pattern: 'out(put' is not a "
                                                      "regular expression"),
    "an algorithm for adamw": (
        ["+optimizer.groups=[{pattern: 'output',algorithm: muon}]"],
        "error: optimizer.groups[0].algorithm: chooses between Muon's and AdamW's update: only optimizer=muon"),
    "muon on a vector": (
        ["optimizer=muon", "+optimizer.groups=[{pattern: 'norm',algorithm: muon}]"],
        "error: optimizer.groups[0].algorithm: muon steps 2-D matrices only; layers.0.attention_norm.weight"),
    "a zero lr scale": (
        ["+optimizer.groups=[{pattern: 'output',lr_scale: 0}]"], "error: optimizer.groups[0].lr_scale: must be "
                                                                 "positive, got 0"),
    "adamw_bf16 on fp32 parameters": (
        ["optimizer=adamw_bf16", "precision=bf16"],
        "error: optimizer: torchao.optim._AdamW steps bf16 parameters (its moments take their dtype); set "
        "precision=bf16 precision.store_dtype=bfloat16, or optimizer=adamw for fp32 parameters"),
    "bf16 parameters under deepspeed": (
        ["parallel=deepspeed", "zero=stage2", "precision=bf16", "precision.store_dtype=bfloat16"],
        "error: precision.store_dtype: parallel=deepspeed keeps parameters in float32: its bf16 engine steps an "
        "fp32 master copy of every parameter itself"),
    "adamw_bf16 under deepspeed": (
        ["parallel=deepspeed", "zero=stage2", "precision=bf16", "precision.store_dtype=bfloat16",
         "optimizer=adamw_bf16"],
        "error: optimizer: torchao.optim._AdamW steps bf16 parameters, which parallel=deepspeed does not keep: its "
        "bf16 engine steps an fp32 master copy of every parameter itself"),
    "bf16 parameters computing in fp32": (
        ["precision.store_dtype=bfloat16"], "error: precision.store_dtype: bfloat16 parameters compute in bf16, not "
                                            "in precision=fp32; set precision=bf16"),
    "bf16 parameters under adapters": (
        ["precision=bf16", "precision.store_dtype=bfloat16", "lora.enabled=true"],
        "error: precision.store_dtype: adapters train in fp32 on their frozen base"),
    "a decay past the run": (
        ["scheduler=wsd", "scheduler.decay_fraction=1.5"], "error: scheduler.decay_fraction: must be in [0, 1]"),
}


@pytest.mark.parametrize("case", CASES)
def test_refused_in_one_line(compose_config, tmp_path, case):
    overrides, line = CASES[case]
    errors = refused(compose_config([*TINY, *overrides]), tmp_path / "run")
    assert len(errors) == 1 and errors[0].startswith(line), errors


def test_a_low_bit_optimizer_without_torchao_names_the_extra(compose_config, tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchao" else find_spec(name, *a))
    errors = refused(compose_config([*TINY, "optimizer=adamw_8bit"]), tmp_path / "run")
    assert errors == ["error: optimizer._target_: torchao.optim.AdamW8bit needs torchao: "
                      "pip install 'framework[lowbit]'"], errors
    errors = refused(compose_config([*TINY, "optimizer=adamw_bf16", "precision=bf16",
                                     "precision.store_dtype=bfloat16"]), tmp_path / "run")
    assert errors == ["error: optimizer._target_: torchao.optim._AdamW needs torchao: "
                      "pip install 'framework[lowbit]'"], errors
