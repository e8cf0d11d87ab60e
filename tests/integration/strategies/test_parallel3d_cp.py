"""Context parallelism (parallel.cp) gives the single-process losses and grad norms (fp32, same seed,
same global batch) alone and composed with tp + sequence parallelism, pp and FSDP over dp x cp, for
llama and gpt2, and so it does with activation checkpointing in each mode (which also gives the same
curve as the cp job without it); a cp2 checkpoint resumes exactly as cp2 and, resharded, as one process. Every run is
made once per module and shared by the assertions that read it."""
import pytest

from tests.harness.helpers import (FAST, assert_planned_activations, assert_planned_comm, check_ok, counters_env,
                                   max_rel_diff, read_metrics, run_framework)

TOL = 1e-4
EXACT = 1e-6
STEPS = ["trainer.max_steps=4", "data.seq_len=32"]
CHECKPOINTS = ["checkpoint.enabled=true", "checkpoint.interval=2"]


def cp(cp=2, tp=1, pp=1, dp_shard=1):
    return ["parallel=3d", f"parallel.cp={cp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
            f"parallel.dp_shard={dp_shard}"]


RUNS = {
    "single": ["parallel=single"],
    "cp2": [*cp(), *CHECKPOINTS],
    "cp2_tp2_sequence_parallel": [*cp(tp=2), "parallel.sequence_parallel=true"],
    "cp2_pp2": cp(pp=2),
    "cp2_dp2_zero3": [*cp(dp_shard=2), "zero=stage3"],
    "gpt2_single": ["model=gpt2_tiny", "parallel=single"],
    "gpt2_cp2": ["model=gpt2_tiny", *cp()],
    "fsdp_x2": ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2"],    # resumes cp2's checkpoint
}
# runs whose collectives and saved activations are counted (tests/fixtures/counters) against the planner
# (not cp2: its checkpoint saves broadcast too)
COUNTED = ("cp2_tp2_sequence_parallel", "cp2_pp2", "cp2_dp2_zero3")
REFERENCE = {name: "gpt2_single" if name.startswith("gpt2") else "single" for name in RUNS if name != "fsdp_x2"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run dir of RUNS[name] (plus extra args), trained once per module."""
    done = {}

    def get(name, *extra):
        key = (name, *extra)
        if key not in done:
            run_dir = tmp_path_factory.mktemp(name)
            counters = counters_env(run_dir) if name in COUNTED and not extra else None
            check_ok(run_framework([*FAST, *STEPS, *RUNS[name], *extra], run_dir, env=counters))
            done[key] = run_dir
        return done[key]
    return get


def _curve(run_dir, key="loss"):
    return [r[key] for r in read_metrics(run_dir)]


@pytest.mark.parametrize("name", [n for n in REFERENCE if REFERENCE[n] != n])
def test_layout_matches_single_loss_and_grad_norm(run, name):
    for key in ("loss", "grad_norm"):
        ref, got = _curve(run(REFERENCE[name]), key), _curve(run(name), key)
        assert len(got) == 4
        assert max_rel_diff(ref, got) <= TOL, key


# one checkpointing mode per cp layout: each recomputes its blocks under cp's gathered attention
CHECKPOINTED = {
    "cp2_dp2_zero3": ["activation_checkpointing=full"],
    "cp2_tp2_sequence_parallel": ["activation_checkpointing=selective", "activation_checkpointing.mode=op"],
    "cp2_pp2": ["activation_checkpointing=selective", "activation_checkpointing.save_matmuls=true",
                "activation_checkpointing.save_every_nth_matmul=2"],
}


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_checkpointing_under_cp_matches_single_and_the_cp_job_without_it(run, name):
    checkpointed = run(name, *CHECKPOINTED[name])
    for key in ("loss", "grad_norm"):
        got = _curve(checkpointed, key)
        assert len(got) == 4
        assert max_rel_diff(_curve(run("single"), key), got) <= TOL, key
        assert max_rel_diff(_curve(run(name), key), got) <= EXACT, key


@pytest.mark.parametrize("name", COUNTED)
def test_planned_communication_and_activations_are_what_the_job_did(run, name):
    """The planner's key/value gathers and their gradients' reduce-scatters (cp/...), FSDP over dp_shard x cp,
    tp and pp traffic at seq_len / cp tokens, and a rank's activations (its share plus the gathered keys
    and values and the query chunks' outputs, per micro-batch in flight under pp), against the collectives
    counted and the bytes autograd kept."""
    assert_planned_comm(run(name))
    assert_planned_activations(run(name))


@pytest.mark.parametrize("name", ["cp2", "single", "fsdp_x2"], ids=["cp2", "cp1_single", "fsdp_x2"])
def test_cp2_checkpoint_resumes(run, name):
    """cp2 from its step-2 checkpoint redoes steps 3-4 exactly; one process (cp1) and fsdp over two
    ranks continue the curve."""
    reference = run("cp2")
    step_2 = reference / "checkpoints" / "step_00000002"
    got = _curve(run(name, f"checkpoint.resume={step_2}"))
    assert len(got) == 2
    assert max_rel_diff(_curve(reference)[2:], got) <= (EXACT if name == "cp2" else TOL)


BAD = {
    "seq_len_not_in_2cp_chunks": (["parallel.cp=3", "data.seq_len=32"], "parallel.cp", "2 x cp = 6 equal chunks"),
    "sequence_parallel_share": (["parallel.cp=2", "parallel.tp=4", "parallel.sequence_parallel=true",
                                 "data.seq_len=36", "model.n_heads=8", "model.n_kv_heads=4"], "parallel.cp",
                                "a cp rank's 18 positions (data.seq_len 36 / cp 2) among parallel.tp=4"),
    "zero_degree": (["parallel.cp=0"], "parallel.cp", "must be a positive degree"),
    "text_samples": (["parallel.cp=2", "trainer.sample_every=2", "trainer.sample_prompt=The"], "trainer.sample_every",
                     "set trainer.sample_every=0"),
    "world_size_product": (["parallel.cp=2", "parallel.tp=2", "launcher.nproc_per_node=2"], "parallel",
                           "cp=2 x tp=2 = 4 processes, but the world size is 2"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_cp_rejected_before_work(compose_config, case):
    from tests.harness.helpers import derive_and_validate
    from framework.errors import ConfigError
    from framework.runtime import world
    from framework.strategies.registry import strategy_class
    args, key, fragment = BAD[case]
    cfg = compose_config([*FAST, "parallel=3d", "parallel.pp=1", "parallel.tp=1", "parallel.dp_shard=1", *args])
    cls = strategy_class("3d")
    with pytest.raises(ConfigError) as e:
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
    assert e.value.key == key
    assert fragment in str(e.value)


@pytest.mark.parametrize("args,fragment", [
    (["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.cp=4", "data.seq_len=36"], "2 x cp = 8 equal chunks"),
    (["parallel=fsdp", "zero=stage3", "parallel.cp=2"], "parallel=3d parallel.tp=1 parallel.pp=1 parallel.cp=2"),
], ids=["3d_seq_len", "fsdp_names_3d"])
def test_bad_cp_is_one_line_exit_2(tmp_path, args, fragment):
    proc = run_framework([*FAST, *args], tmp_path / "run", timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: parallel.cp: "), proc.stderr
    assert fragment in lines[0]
    assert not (tmp_path / "run" / "config.yaml").exists()


def _plan(compose_config, *args, world):
    from tests.harness.helpers import derive_and_validate
    from framework.plan.hardware import device_named
    from framework.plan.planner import make_plan
    from framework.strategies.registry import strategy_class
    cfg = compose_config(["model=small", "data=synthetic", "precision=bf16", "trainer.eval_every=0",
                          "trainer.global_batch_size=8", "trainer.micro_batch_size=1", *args])
    derive_and_validate(cfg, world, strategy_class(cfg.parallel.name))
    return cfg, make_plan(cfg, world, device_named("h100"), 8)


def test_plan_divides_a_ranks_sequence_and_counts_the_key_value_traffic(compose_config):
    """Against the same sequence over dp: a cp rank's activations are its 1/cp share plus the keys and
    values of the rest, and it moves those keys/values once per block forward and backward."""
    seq = ["data.seq_len=4096", "model.max_seq_len=4096"]
    _, dp = _plan(compose_config, "parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=4",
                  "zero=stage3", *seq, world=4)
    cfg, cp = _plan(compose_config, "parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=1",
                    "parallel.cp=4", "zero=stage3", *seq, world=4)
    from framework.plan.planner import _gathered_kv_bytes, _kv_dim
    kv = _gathered_kv_bytes(cfg, cp.layout, cfg.model.n_layers)
    # per block: the other 3/4 of the keys and values, and the query chunks' own outputs (bf16)
    assert kv == cfg.model.n_layers * (2 * 4096 * 3 // 4 * _kv_dim(cfg) + 4096 // 4 * cfg.model.dim) * 2
    per_seq = dp.per_rank_bytes["activations"]   # dp: one whole sequence per micro-batch
    assert abs(cp.per_rank_bytes["activations"] - kv - per_seq / 4) <= 0.1 * per_seq / 4
    comm = cp.comm_bytes_per_step
    # every cp rank takes the whole global batch (dp = 1); per sequence and block: keys and values of all
    # 4096 positions, bf16
    per_step = cfg.trainer.global_batch_size * cfg.model.n_layers * 2 * 4096 * _kv_dim(cfg) * 2
    assert comm["cp/all_gather"] == comm["cp/reduce_scatter"] == per_step
    assert cp.time_s["cp"] > 0 and "cp" not in dp.time_s or dp.time_s["cp"] == 0


def test_auto_tries_cp_for_long_sequences_only(compose_config):
    from framework.plan.auto import candidates
    def cps(seq_len):
        cfg = compose_config(["model=small", f"data.seq_len={seq_len}", "trainer.global_batch_size=8"])
        return {dict(c.parallel).get("cp", 1) for c in candidates(cfg, 8, 8, ["3d"])}
    assert cps(1024) == {1}
    assert cps(16384) == {1, 2, 4, 8}
