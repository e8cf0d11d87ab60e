"""The planner (python -m framework.plan): DeepSpeed's own estimators agree on ZeRO's model states,
activation bytes match what autograd keeps on the real model, the CLI prints JSON, and a job that
cannot fit its device is refused before launch. (Model-state bytes equal to what real jobs measure is
asserted beside each layout's parity test: tests/harness/helpers.assert_planned_model_states.)"""
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from framework.config.paths import CONFIG_DIR
from tests.harness.helpers import derive_and_validate
from framework.compose.config_store import register_configs
from framework.models.spec import spec_for
from framework.parallel.activation_checkpointing import checkpoint_activations
from framework.parallel.blocks import find_blocks
from framework.plan.activations import measure
from framework.plan.auto import TIE, report, simplicity
from framework.plan.layout import Casting, layout_of
from framework.plan.model_states import model_states
from framework.plan.shapes import rank_parameters
from framework.strategies.registry import strategy_class
from tests.harness.docs_commands import environment, run_by
from tests.harness.helpers import REPO, run_framework, run_in_own_session

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True


def config(*overrides, world=1):
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    derive_and_validate(cfg, world, strategy_class(cfg.parallel.name))
    return cfg


def states(cfg, world):
    layout = layout_of(cfg, world)
    return model_states(cfg, layout, rank_parameters(cfg, layout)), layout


def test_zero_model_states_agree_with_deepspeeds_estimators():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    world = 8
    common = ["model=gpt2_124m", "parallel=deepspeed", "precision=bf16", "data.seq_len=64",
              "trainer.global_batch_size=8", "parallel.stage3_param_persistence_threshold=0"]
    n = spec_for(config(*common, "zero=stage2", world=world).model).num_params(
        config(*common, "zero=stage2", world=world).model)

    ours, _ = states(config(*common, "zero=stage2", world=world), world)
    _, ds = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=world, cpu_offload=False)
    # DeepSpeed's 18 bytes per parameter and rank count a 4-byte fp32 gradient partition that lives only
    # inside the optimizer step; ours are the states held between steps. The rest is ZeRO's padding.
    assert abs(ours.total + 4 * n / world - ds) <= 18 * 4 + 8, (ours, ds)

    ours, _ = states(config(*common, "zero=stage2", "zero.offload_optimizer=true", world=world), world)
    _, ds = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=world, cpu_offload=True)
    assert ours.total - ours.offloaded == ds == 2 * n          # only the bf16 parameters stay on the GPU

    ours, _ = states(config(*common, "zero=stage3", "zero.offload_optimizer=true", world=world), world)
    _, ds, largest = estimate_zero3_model_states_mem_needs(n, 0, num_gpus_per_node=world, cpu_offload=True,
                                                           cpu_offload_params=False)
    assert abs(ours.total - ours.offloaded - ds) <= 2 * 2 * len(rank_parameters(*_cfg_layout(common, world)))


def _cfg_layout(common, world):
    cfg = config(*common, "zero=stage3", world=world)
    return cfg, layout_of(cfg, world)


def _saved_bytes(cfg, micro_batch, casting=Casting()):
    """What autograd keeps for backward on the real model: saved tensors (not parameters), plus the inputs
    that non-reentrant checkpointing holds for each recomputed block. casting.weights: the parameters in
    bf16, as FSDP2's policy hands them to the blocks (and DeepSpeed's bf16 engine holds them)."""
    spec = spec_for(cfg.model)
    torch.manual_seed(0)
    model = spec.build(cfg.model)
    checkpoint_activations(model, cfg.activation_checkpointing, spec)
    if casting.weights:
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    def keep_input(_module, args):
        s = args[0].untyped_storage()
        storages[s.data_ptr()] = s.nbytes()

    if cfg.activation_checkpointing.mode != "none":
        for name, block in find_blocks(model, spec.block_classes(model)):
            if getattr(block, "_checkpointed", True):
                block.register_forward_pre_hook(keep_input)
    tokens = torch.randint(0, cfg.model.vocab_size, (micro_batch, cfg.data.seq_len))
    dtype = {"bf16": torch.bfloat16}.get(cfg.precision.name)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None and casting.autocast):
        loss = F.cross_entropy(model(tokens).flatten(0, -2).float(), tokens.flatten())
    loss.backward()
    return sum(storages.values())


@pytest.mark.parametrize("model", ["tiny", "gpt2_tiny"])
@pytest.mark.parametrize("extra,casting", [
    ([], Casting()), (["activation_checkpointing=full"], Casting()), (["precision=bf16"], Casting()),
    (["precision=bf16"], Casting(weights=True, autocast=False)),
    (["activation_checkpointing=selective", "activation_checkpointing.every_n_layers=1"], Casting())],
    ids=["none", "full", "bf16", "bf16_weights", "selective"])
def test_activation_bytes_match_what_autograd_keeps(model, extra, casting):
    cfg = config(f"model={model}", "data.seq_len=64", *extra)
    # as the planner does: one sequence's bytes times the micro-batch, plus autocast's weight copies once
    profile, blocks = measure(cfg, 1, 64, casting=casting), list(range(cfg.model.n_layers))
    planned = 4 * profile.stage_bytes(blocks, True, True, tp=1, sp=False) + profile.stage_copies(blocks, True, True, tp=1)
    measured = _saved_bytes(cfg, 4, casting)
    assert planned == pytest.approx(measured, rel=0.10), (planned, measured)


def test_plan_prints_json_with_every_number():
    proc = run_in_own_session([sys.executable, "-m", "framework.plan", "--json", "model=gpt2_tiny", "parallel=fsdp",
                               "zero=stage3"], cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert set(plan["per_rank_bytes"]) >= {"params", "grads", "optimizer", "master", "activations", "buffers", "total"}
    m = plan["per_rank_bytes"]
    # the peak is backward's (gradients appear as activations go) or the optimizer step's (with its scratch)
    states = sum(m[k] for k in ("params", "grads", "optimizer", "master"))
    backward = states - m["grads"] + max(m["grads"], m["activations"] + m["buffers"])
    assert m["total"] == max(backward, states + m["step_scratch"])
    assert m["peak_at"] == ("backward" if backward >= states + m["step_scratch"] else "optimizer step")
    assert plan["fits"] is True and plan["comm_bytes_per_step"]["dp_shard/reduce_scatter"] > 0
    assert plan["step_time_s"] > 0 and plan["tokens_per_sec"] > 0 and 0 < plan["mfu"] <= 1


def test_a_job_that_cannot_fit_is_refused_before_launch_with_the_cheapest_fix(tmp_path):
    # 2 ranks x 32 sequences of 2048 tokens: the activations alone outgrow a 40 GB A100.
    proc = run_framework(["model=llama_125m", "parallel=ddp", "planner.device=a100_40gb", "data.seq_len=2048",
                          "trainer.global_batch_size=64"], tmp_path / "run", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: planner: the most loaded rank needs "), proc.stderr
    assert "one a100_40gb holds 40.0 GiB" in lines[0], lines[0]
    assert "planner.check=false" in lines[0], "the refusal names how to run the job anyway"
    fix = lines[0].split("the cheapest change that fits: ")[1].split(" (")[0]
    # the change it names does fit: the same job with it passes the check (and stops on the next rule)
    proc = run_framework(["model=llama_125m", "parallel=ddp", "planner.device=a100_40gb", "data.seq_len=2048",
                          "trainer.global_batch_size=64", fix, "trainer.max_steps=0"], tmp_path / "run1", timeout=120)
    assert proc.returncode == 2 and "planner" not in proc.stderr and "trainer.max_steps" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
    # planner.check=false lets the user take the risk (the run is then stopped by its bad batch size).
    proc = run_framework(["model=llama3_8b", "parallel=ddp", "planner.device=a100_40gb", "planner.check=false",
                          "trainer.global_batch_size=3"], tmp_path / "run2", timeout=120)
    assert proc.returncode == 2 and "planner" not in proc.stderr and "global_batch_size" in proc.stderr


def _docs_plan_commands() -> list:
    return [c for c in run_by(__file__) if c.text.startswith("python -m framework.plan ")]


def test_docs_plan_commands_run_as_written(tmp_path):
    commands = _docs_plan_commands()
    assert len(commands) >= 5
    for command in commands:
        args = command.text.split()[3:]
        proc = run_in_own_session([sys.executable, "-m", "framework.plan", *args], cwd=tmp_path, timeout=300,
                                  env={**__import__("os").environ, **environment(command, {"PYTHONPATH": str(REPO)})})
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        if "--json" in args:
            assert json.loads(proc.stdout)["fits"] is True
        else:
            assert "per-rank memory" in proc.stdout and "fits" in proc.stdout


def test_parallel_auto_is_deterministic_and_its_ranking_fits():
    from framework.plan.auto import rank_layouts
    from framework.plan.hardware import device_named
    cfg = config("model=llama_125m", "parallel=ddp", "data.seq_len=1024", "precision=bf16", "trainer.global_batch_size=64",
                 world=8)
    cfg.parallel = {"name": "auto", "strategies": ["ddp", "fsdp", "deepspeed", "3d"], "top": 5}
    first = rank_layouts(cfg, 8, device_named("h100"), 8)
    again = rank_layouts(cfg, 8, device_named("h100"), 8)
    assert [c for c, _ in first] == [c for c, _ in again]
    assert all(p.fits for _, p in first)
    assert {c.strategy for c, _ in first} >= {"ddp", "fsdp", "deepspeed", "3d"}
    # layouts predicted within TIE of the fastest lead, simplest first; the rest follow fastest first
    fastest = min(p.step_time_s for _, p in first)
    tied = [(c, p) for c, p in first if p.step_time_s <= fastest * (1 + TIE)]
    assert first[:len(tied)] == tied
    assert [simplicity(c) for c, _ in tied] == sorted(simplicity(c) for c, _ in tied)
    rest = [p.step_time_s for _, p in first[len(tied):]]
    assert rest == sorted(rest) and rest[0] > fastest * (1 + TIE)


def test_parallel_auto_says_why_whichever_part_of_the_step_decides():
    """The pick is explained by the part of the step where #1 gains most over #2, whichever it is
    (a CPU ranking decided by the optimizer step once raised a KeyError instead)."""
    from dataclasses import replace

    from framework.plan.auto import rank_layouts
    from framework.plan.hardware import device_named
    cfg = config("model=llama_125m", "parallel=ddp", "data.seq_len=2048", "precision=bf16",
                 "trainer.global_batch_size=128", world=8)
    cfg.parallel = {"name": "auto", "strategies": ["ddp"], "top": 5}
    (cand, plan), (other, _) = rank_layouts(cfg, 8, device_named("h100"), 8)[:2]
    reasons = set()
    for part in plan.time_s:
        slower = replace(plan, step_time_s=plan.step_time_s * 1.1,
                         time_s={**plan.time_s, part: plan.time_s[part] + 0.1 * plan.step_time_s})
        text = report([(cand, plan), (other, slower)], 2)
        assert "10.0% faster than the next: " in text, text
        reasons.add(text.rsplit(": ", 1)[1])
    assert len(reasons) == len(plan.time_s)


def test_parallel_auto_breaks_a_predicted_tie_toward_less_machinery():
    """A 125M model on 8 H100s, 16 sequences of 2,048 tokens a rank: DDP and every ZeRO stage are predicted
    alike (the gradient traffic hides behind backward, and DDP's unsharded optimizer step is 1% of the
    step); DDP runs, not the layout that happens to need the least memory (ZeRO-3)."""
    from framework.plan.auto import rank_layouts
    from framework.plan.hardware import device_named
    cfg = config("model=llama_125m", "parallel=ddp", "data.seq_len=2048", "precision=bf16",
                 "trainer.global_batch_size=128", world=8)
    cfg.parallel = {"name": "auto", "strategies": ["ddp", "deepspeed"], "top": 5}
    ranked = rank_layouts(cfg, 8, device_named("h100"), 8)
    fastest = min(p.step_time_s for _, p in ranked)
    tied = [c for c, p in ranked if p.step_time_s <= fastest * (1 + TIE)]
    assert {c.strategy for c in tied} == {"ddp", "deepspeed"}, "the case needs a tie to break"
    assert (ranked[0][0].strategy, ranked[0][0].zero) == ("ddp", 0)
    assert [c for c, _ in ranked[:len(tied)]] == sorted(tied, key=simplicity)
    least_memory = min(ranked[:len(tied)], key=lambda cp: cp[1].per_rank_bytes["total"])[0]
    assert least_memory.strategy == "deepspeed" and least_memory.zero == 3
    assert "a tie the plan cannot separate; #1 has less machinery (ddp, zero 0)" in report(ranked, 5)


def test_parallel_auto_runs_its_pick_and_writes_it_to_the_resolved_config(tmp_path):
    """The docs' parallel=auto command, as written (2 steps), from another directory."""
    import os

    from omegaconf import OmegaConf

    from tests.harness.helpers import check_ok, read_metrics
    command = next(c for c in run_by(__file__) if c.text.startswith("python -m framework parallel=auto"))
    proc = run_in_own_session([sys.executable, *command.text.split()[1:], "trainer.max_steps=2",
                               "trainer.eval_batches=1", "trainer.progress_bar=false",
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=300,
                              env={**os.environ, **environment(command, {"PYTHONPATH": str(REPO)})})
    check_ok(proc)
    assert "parallel=auto: " in proc.stderr and "picked #1: " in proc.stderr
    picked = next(line for line in proc.stderr.splitlines() if line.strip().startswith("1 ")).split()[1]
    resolved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert picked == f"parallel={resolved.parallel.name}" and resolved.parallel.name != "auto"
    assert read_metrics(tmp_path / "run")[-1]["world_size"] == 2


def test_a_cpu_plan_times_the_model_here_and_each_rank_steps_its_share_of_the_optimizer():
    """On the CPU the compute and optimizer times come from timing the job's own model on every core
    (benchmarks/plan_step_time.py holds them against measured steps); too large a model is not timed."""
    from framework.plan.hardware import measured_cpu
    from framework.plan.planner import make_plan
    common = ("model=small", "data.seq_len=64", "trainer.global_batch_size=8", "trainer.micro_batch_size=4")
    single = make_plan(config(*common, "parallel=single"), 1, measured_cpu(), 1)
    zero3 = make_plan(config(*common, "parallel=fsdp", "zero=stage3", world=2), 2, measured_cpu(), 2)
    assert single.time_s["optimizer"] > 0
    assert zero3.time_s["optimizer"] == pytest.approx(single.time_s["optimizer"] / 2, rel=0.02)
    big = make_plan(config("model=llama_125m", "data.seq_len=1024", "trainer.micro_batch_size=8", "parallel=single"),
                    1, measured_cpu(), 1)
    assert big.time_s["optimizer"] == 0 and big.time_s["compute"] > 0


def test_a_cpu_tensor_parallel_plan_adds_what_dtensor_costs_the_rank():
    """The timed model is plain tensors and whole; a tp rank also pays DTensor's dispatch around its
    sharded linears (and norms under SP), timed on the job's own model and plan over a fake process
    group that the planner leaves behind it."""
    import torch.distributed as dist

    from framework.plan.cpu_calibration import tensor_parallel_overhead_s
    from framework.plan.hardware import measured_cpu
    from framework.plan.planner import make_plan
    common = ("model=small", "data.seq_len=64", "trainer.global_batch_size=8", "trainer.micro_batch_size=4")
    ddp = make_plan(config(*common, "parallel=ddp", world=2), 2, measured_cpu(), 2)
    tp_cfg = config(*common, "parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1", world=2)
    tp2 = make_plan(tp_cfg, 2, measured_cpu(), 2)
    overhead = tensor_parallel_overhead_s(tp_cfg, 64, 2, False)
    assert overhead > 0 and tensor_parallel_overhead_s(tp_cfg, 64, 2, True) > 0
    assert not dist.is_initialized()
    extra = tp2.layout.accumulation * overhead
    assert tp2.time_s["compute"] - ddp.time_s["compute"] == pytest.approx(extra, rel=1e-6)


def test_recomputing_every_other_matmul_is_planned_between_keeping_all_and_full_recompute():
    from framework.plan.hardware import device_named
    from framework.plan.planner import make_plan
    # a GPU's step comes from the traced operators (the recompute's matmuls among them), a CPU's from FLOPs
    for device, precision in ((device_named("h100"), "bf16"), (device_named("cpu"), "bf16")):
        plans = [make_plan(config("model=tiny", "data.seq_len=64", f"precision={precision}", *ac), 1, device, 1)
                 for ac in (["activation_checkpointing=selective", "activation_checkpointing.mode=op"],
                            ["activation_checkpointing=selective", "activation_checkpointing.mode=op",
                             "activation_checkpointing.save_every_nth_matmul=2"],
                            ["activation_checkpointing=full"])]
        times = [p.time_s["compute"] for p in plans]
        held = [p.per_rank_bytes["activations"] for p in plans]
        assert times[0] < times[1] < times[2], (device.name, times)
        assert held[0] > held[1] > held[2], (device.name, held)


def test_parallel_autos_pick_for_a_long_sequence_scaled_down_to_cpu_matches_single(tmp_path, single_reference):
    """80k tokens a sequence on two 40 GB A100s: what fits is context parallelism with activation checkpointing
    (a sequence's activations outgrow one device), and auto picks it. That layout, the same degrees, zero
    stage, checkpointing and micro-batch, on a tiny model and short sequences on the CPU, trains as one
    process does."""
    from framework.plan.auto import rank_layouts
    from framework.plan.hardware import device_named
    from tests.harness.helpers import FAST, losses, max_rel_diff
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=["parallel=auto", "model=llama_125m", "data=synthetic", "data.seq_len=81920",
                                           "model.max_seq_len=81920", "precision=bf16", "trainer.global_batch_size=2",
                                           "trainer.eval_every=0"])
    pick = rank_layouts(cfg, 2, device_named("a100_40gb"), 2)[0][0]
    assert dict(pick.parallel).get("cp", 1) > 1 and pick.ac != "none", pick.describe()
    run_dir = tmp_path / "pick"
    proc = run_framework([*FAST, *pick.overrides()], run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max_rel_diff(single_reference(), losses(run_dir)) <= 1e-5
