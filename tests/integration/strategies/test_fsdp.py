"""parallel=fsdp (FSDP2): the single-process run in every layout (tests/harness/parity.py), measured sharding, config
errors."""
import pytest

from tests.harness.helpers import (assert_planned_comm, assert_planned_model_states, counters_env, losses, read_metrics,
                                   run_framework, train_run)
from tests.harness.parity import assert_parity


# layouts whose collectives are counted (tests/fixtures/counters) and compared with the planner's bytes
COUNTED = {"zero2_x2", "zero3_x2", "hsdp_2x2"}


@pytest.mark.parametrize("name,args", [
    ("zero2_x2", ["zero=stage2", "launcher.nproc_per_node=2"]),
    ("zero3_x2", ["zero=stage3"]),          # launcher.nproc_per_node unset: fsdp defaults to 2
    ("hsdp_2x2", ["zero=stage3", "parallel.dp_replicate=2", "parallel.dp_shard=2"]),
    ("zero3_ac_full", ["zero=stage3", "activation_checkpointing=full"]),
    ("zero3_ac_selective", ["zero=stage3", "activation_checkpointing=selective"]),
    ("zero3_offload", ["zero=stage3", "zero.offload_params=true"]),
])
def test_fsdp_matches_single(tmp_path, reference_run, name, args):
    run_dir = train_run(tmp_path, name, ["parallel=fsdp", *args],
                        env=counters_env(tmp_path / name) if name in COUNTED else None)
    assert len(losses(run_dir)) == 8
    assert_parity(run_dir, reference_run())
    assert_planned_model_states(run_dir)
    if name in COUNTED:
        assert_planned_comm(run_dir)


def test_zero3_x4_matches_single_and_holds_a_quarter_of_ddp_optimizer_state(tmp_path, reference_run, trained_run):
    workers = 4
    run_dir = train_run(tmp_path, "zero3_x4", ["parallel=fsdp", "zero=stage3", f"launcher.nproc_per_node={workers}"])
    assert_parity(run_dir, reference_run())
    fsdp, ddp = read_metrics(tmp_path / "zero3_x4")[-1], read_metrics(trained_run("parallel=ddp"))[-1]
    assert ddp["world_size"] == 2
    # ddp holds full replicas; FSDP2 shards every tensor evenly (up to a few scalar `step` counters).
    for key in ("param_bytes", "grad_bytes", "optim_state_bytes"):
        assert fsdp[key] / ddp[key] == pytest.approx(1 / workers, rel=0.01), key


@pytest.mark.parametrize("args,key,expected", [
    (["zero=stage1"], "zero", "parallel=ddp zero=stage1"),
    (["zero=none"], "zero", "zero=stage2"),
    (["zero=stage3", "parallel.dp_replicate=2", "parallel.dp_shard=2", "launcher.nproc_per_node=2"],
     "parallel.dp_shard", "2 x 2 = 4 does not match the world size 2"),
])
def test_invalid_fsdp_configs_exit_2_with_one_line(tmp_path, args, key, expected):
    proc = run_framework(["model=tiny", "parallel=fsdp", *args], tmp_path / "run", timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: "), proc.stderr
    assert expected in lines[0]
    assert not (tmp_path / "run").exists()
