"""optimizer=muon in the sharded layouts gives the single-process run (tests/harness/parity.py: loss and grad norm
of every step, the final parameters): the orthogonalisation sees whole matrices under FSDP2 shards (gathered, or
on one owner rank) and under tensor-parallel shards; the planner counts its states as rank 0 measured them."""
import pytest

from tests.harness.helpers import assert_planned_model_states, losses, train_run
from tests.harness.parity import assert_parity

MUON = ["optimizer=muon", "scheduler=wsd", "scheduler.warmup_steps=2", "trainer.max_steps=6"]

LAYOUTS = {
    "ddp_zero1_x2": ["parallel=ddp", "zero=stage1", "launcher.nproc_per_node=2"],
    "fsdp_zero2_x2": ["parallel=fsdp", "zero=stage2", "launcher.nproc_per_node=2"],
    "fsdp_zero3_x2_round_robin": ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2",
                                  "optimizer.mode=round_robin"],
    "3d_dp2_tp2_zero3": ["parallel=3d", "parallel.dp_shard=2", "parallel.tp=2", "zero=stage3"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_muon_layout_matches_single(tmp_path, reference_run, layout):
    run_dir = train_run(tmp_path, layout, [*LAYOUTS[layout], *MUON])
    assert len(losses(run_dir)) == 6
    assert_parity(run_dir, reference_run(*MUON))
    assert_planned_model_states(run_dir)
