"""Data parallel layouts give the single-process losses (fp32, same seed, same global batch)."""
from tests.helpers import assert_planned_comm, assert_planned_model_states, counters_env, max_rel_diff, train

TOL = 1e-5


def test_ddp_two_workers_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "ddp", ["parallel=ddp", "launcher.nproc_per_node=2"], env=counters_env(tmp_path / "ddp"))
    assert len(got) == 8
    assert max_rel_diff(single_reference(), got) <= TOL
    assert_planned_model_states(tmp_path / "ddp")
    assert_planned_comm(tmp_path / "ddp")


def test_ddp_zero_stage1_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "ddp_z1", ["parallel=ddp", "zero=stage1", "launcher.nproc_per_node=2"],
                env=counters_env(tmp_path / "ddp_z1"))
    assert max_rel_diff(single_reference(), got) <= TOL
    assert_planned_model_states(tmp_path / "ddp_z1")
    assert_planned_comm(tmp_path / "ddp_z1")


def test_ddp_under_torchrun_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "torchrun", ["parallel=ddp"], torchrun_nproc=2)
    assert max_rel_diff(single_reference(), got) <= TOL


def test_ddp_static_graph_without_accumulation_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "static", ["parallel=ddp", "parallel.static_graph=true", "trainer.micro_batch_size=4"])
    assert max_rel_diff(single_reference(), got) <= TOL


def test_ddp_options_and_comm_hook_still_learn(tmp_path, single_reference):
    """fp16 gradient compression changes the numbers a little, never the direction."""
    got = train(tmp_path, "hook", ["parallel=ddp", "parallel.comm_hook=fp16", "parallel.gradient_as_bucket_view=true"])
    ref = single_reference()
    assert max_rel_diff(ref, got) <= 1e-2
    assert got[-1] < got[0]
