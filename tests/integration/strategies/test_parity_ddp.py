"""Data parallel layouts give the single-process run (fp32, same seed, same global batch): its loss and
grad norm at every step and its final weights (tests/harness/parity.py)."""
from tests.harness.helpers import assert_planned_comm, assert_planned_model_states, counters_env, losses, train_run
from tests.harness.parity import assert_parity


def test_ddp_two_workers_matches_single(tmp_path, reference_run):
    run_dir = train_run(tmp_path, "ddp", ["parallel=ddp", "launcher.nproc_per_node=2"],
                        env=counters_env(tmp_path / "ddp"))
    assert len(losses(run_dir)) == 8
    assert_parity(run_dir, reference_run())
    assert_planned_model_states(run_dir)
    assert_planned_comm(run_dir)


def test_ddp_zero_stage1_matches_single(tmp_path, reference_run):
    run_dir = train_run(tmp_path, "ddp_z1", ["parallel=ddp", "zero=stage1", "launcher.nproc_per_node=2"],
                        env=counters_env(tmp_path / "ddp_z1"))
    assert_parity(run_dir, reference_run())
    assert_planned_model_states(run_dir)
    assert_planned_comm(run_dir)


def test_ddp_under_torchrun_matches_single(tmp_path, reference_run):
    assert_parity(train_run(tmp_path, "torchrun", ["parallel=ddp"], torchrun_nproc=2), reference_run())


def test_ddp_static_graph_without_accumulation_matches_single(tmp_path, reference_run):
    run_dir = train_run(tmp_path, "static", ["parallel=ddp", "parallel.static_graph=true",
                                             "trainer.micro_batch_size=4"])
    assert_parity(run_dir, reference_run())


def test_ddp_options_and_comm_hook_still_learn(tmp_path, reference_run):
    """fp16 gradient compression changes the numbers a little, never the direction."""
    run_dir = train_run(tmp_path, "hook", ["parallel=ddp", "parallel.comm_hook=fp16",
                                           "parallel.gradient_as_bucket_view=true"])
    assert assert_parity(run_dir, reference_run())["kind"] == "fp16-comm"
    got = losses(run_dir)
    assert got[-1] < got[0]
