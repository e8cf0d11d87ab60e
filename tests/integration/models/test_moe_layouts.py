"""model=moe_tiny under every layout: loss, grad norm and balance loss equal to parallel=single's (fp32, 1e-6
relative per step; the balance loss counts its expert fractions over the global batch, so one forward of all
8 sequences, 4 micro-batches of 2, and every dp/ep/pp/cp split agree), the same expert assignment (logged
expert shares) everywhere, activation checkpointing in each of its modes among the layouts, and its Mixtral
export read by transformers with our logits, then imported back through checkpoint.initial_load; expert
parallelism (ep2, with tp2, with pp2, with cp2) among the layouts, and its checkpoint resumed exactly and
resharded to single. The runs are shared by the whole module."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from framework.checkpoint.names import read_meta
from framework.data.batches import GlobalBatchSampler, micro_batches, split_train_val
from framework.data.sources import load_tokens
from framework.export.read import READERS
from framework.models.loss import cross_entropy
from framework.models.moe.spec import SPEC
from tests.harness.helpers import FAST, assert_planned_model_states, check_ok, max_rel_diff, read_metrics, run_framework

STEPS = 4
MOE = ["model=moe_tiny", f"trainer.max_steps={STEPS}", "checkpoint.enabled=true", f"checkpoint.interval={STEPS}"]
FULL = ["activation_checkpointing=full"]
OP = ["activation_checkpointing=selective", "activation_checkpointing.mode=op"]
EVERY_OTHER_MATMUL = ["activation_checkpointing=selective", "activation_checkpointing.save_matmuls=true",
                      "activation_checkpointing.save_every_nth_matmul=2"]
LAYOUTS = {
    "single": ["parallel=single"],
    # the whole global batch in one forward: the balance loss's own definition, no statistics pass
    "single_mb8": ["parallel=single", "trainer.micro_batch_size=8"],
    "ddp": ["parallel=ddp", *FULL],
    "fsdp_z3": ["parallel=fsdp", "zero=stage3", *OP],
    "deepspeed_z2": ["parallel=deepspeed", "zero=stage2", *EVERY_OTHER_MATMUL],
    # expert parallelism; the ep2 run also saves at step 2 for the resume tests
    "3d_ep2": ["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=2", "parallel.ep=2",
               "checkpoint.interval=2"],
    "3d_ep2_tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=2", "parallel.ep=2", *FULL],
    "3d_ep2_pp2": ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=2", "parallel.ep=2", *OP],
    # every cp rank holds the same experts: their gradients are summed over cp
    "3d_ep2_cp2": ["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.cp=2", "parallel.dp_shard=2",
                   "parallel.ep=2", *FULL],
}
TOL = 1e-6
_runs: dict[str, Path] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    def get(name: str) -> list[dict]:
        if name not in _runs:
            run_dir = tmp_path_factory.mktemp(name)
            check_ok(run_framework([*FAST, *MOE, *LAYOUTS[name]], run_dir))
            _runs[name] = run_dir
        return read_metrics(_runs[name])
    return get


def shares(records: list[dict]) -> list[list[list[float]]]:
    return [[r[k] for k in sorted(r) if k.endswith("_expert_share")] for r in records]


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "single"])
def test_layout_matches_single_and_routes_alike(runs, name):
    ref, got = runs("single"), runs(name)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for key in ("loss", "grad_norm", "moe_aux_loss"):
        assert max_rel_diff([r[key] for r in ref], [r[key] for r in got]) <= TOL, key
    # the same tokens go to the same experts: every layer's share of tokens per expert, every step
    assert shares(got) == shares(ref)
    assert any(len(set(layer)) > 1 for step in shares(ref) for layer in step)   # not trivially uniform


def test_expert_load_and_aux_loss_are_logged_apart_from_the_loss(runs):
    first = runs("single")[0]
    layers = [k for k in first if k.endswith("_expert_share")]
    assert len(layers) == 2 and all(len(first[k]) == 4 and abs(sum(first[k]) - 1) < 1e-5 for k in layers)
    ratio = max(max(first[k]) / (sum(first[k]) / 4) for k in layers)
    assert first["moe_load_max_over_mean"] == pytest.approx(ratio, rel=1e-4)
    assert first["moe_aux_loss"] > 0 and first["moe_aux_loss"] != first["loss"]


def step_dir(name: str) -> Path:
    return _runs[name] / "checkpoints" / f"step_{STEPS:08d}"


def our_model(ckpt: Path, weights=None):
    cfg = OmegaConf.load(ckpt / "config.yaml").model
    model = SPEC.build(cfg).eval()
    if weights is None:
        model.load_state_dict(READERS[read_meta(str(ckpt))["format"]](str(ckpt)))
    else:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(weights.full(n))
    return model


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory) -> Path:
    runs("fsdp_z3")
    out = tmp_path_factory.mktemp("hf") / "moe"
    proc = run_framework([str(step_dir("fsdp_z3")), str(out)], module="framework.export", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


@torch.no_grad()
def test_mixtral_export_gives_our_logits_in_transformers_and_reads_back(exported):
    transformers = pytest.importorskip("transformers")
    assert json.loads((exported / "config.json").read_text())["model_type"] == "mixtral"
    hf = transformers.MixtralForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    ours = our_model(step_dir("fsdp_z3"))
    back = our_model(step_dir("fsdp_z3"), SPEC.hf_weights(str(exported), OmegaConf.load(
        step_dir("fsdp_z3") / "config.yaml").model))
    tokens = torch.randint(0, hf.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    theirs = hf(tokens).logits
    torch.testing.assert_close(ours(tokens), theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(back(tokens), theirs, atol=1e-4, rtol=0)
    # the experts really differ from each other (a wrong expert order would show)
    w1 = ours.layers["0"].feed_forward.experts.w1
    assert not torch.allclose(w1[0], w1[1])


def test_initial_load_from_the_mixtral_export_starts_from_its_weights(tmp_path, exported):
    run_dir = tmp_path / "init"
    check_ok(run_framework([*FAST, "model=moe_tiny", "trainer.max_steps=1", "scheduler.warmup_steps=0",
                            "parallel=ddp", f"checkpoint.initial_load={exported}"], run_dir))
    cfg = OmegaConf.load(step_dir("fsdp_z3") / "config.yaml")
    model = our_model(step_dir("fsdp_z3"), SPEC.hf_weights(str(exported), cfg.model))
    train, _ = split_train_val(load_tokens(cfg.data), cfg.data.val_fraction)
    batch = GlobalBatchSampler(train, cfg.data.seq_len, cfg.trainer.global_batch_size, cfg.seed).local_batch(0, 0, 1)
    with torch.no_grad():
        expected = float(torch.stack([cross_entropy(model(x), y) for x, y in micro_batches(batch, 2)]).mean())
    assert abs(read_metrics(run_dir)[0]["loss"] - expected) <= 1e-5


def resume_from_step_2(tmp_path: Path, source: str, layout: list[str]) -> list[float]:
    ckpt = _runs[source] / "checkpoints" / f"step_{2:08d}"
    run_dir = tmp_path / "resumed"
    check_ok(run_framework([*FAST, *MOE, *layout, f"checkpoint.resume={ckpt}"], run_dir))
    return [r["loss"] for r in read_metrics(run_dir)]


def test_expert_parallel_resume_is_exact(tmp_path, runs):
    whole = runs("3d_ep2")
    resumed = resume_from_step_2(tmp_path, "3d_ep2", LAYOUTS["3d_ep2"])
    assert resumed == [r["loss"] for r in whole[2:]]


def test_expert_parallel_checkpoint_reshards_to_single(tmp_path, runs):
    runs("3d_ep2")
    single = runs("single")
    resumed = resume_from_step_2(tmp_path, "3d_ep2", LAYOUTS["single"])
    assert len(resumed) == STEPS - 2
    assert max_rel_diff(resumed, [r["loss"] for r in single[2:]]) <= TOL


@pytest.mark.parametrize("name", ["fsdp_z3", "3d_ep2", "3d_ep2_tp2", "3d_ep2_pp2"])
def test_planner_holds_what_the_job_holds(runs, name):
    """Parameter, gradient and optimizer bytes a rank holds, experts sharded by ep included."""
    runs(name)
    assert_planned_model_states(_runs[name])
