"""trainer.on_oom=retry: an out-of-memory error injected inside a step (FRAMEWORK_FAULT=oom:..., see
framework/runtime/faults.py) halves the micro-batch on every rank and runs the step again; the global batch stays,
so the losses are those of a run at the smaller micro-batch throughout. At micro-batch 1 the job stops."""
import pytest

from framework.parallel.batch_layout import BatchLayout
from framework.train.step_batches import lacked
from tests.harness.helpers import FAST, max_rel_diff, read_metrics, run_framework

MICRO4 = [*FAST, "trainer.micro_batch_size=4", "trainer.on_oom=retry"]


def test_halving_keeps_dividing_the_share():
    assert BatchLayout(8, 1, 4).halved() == BatchLayout(8, 1, 2)
    assert BatchLayout(12, 1, 6).halved() == BatchLayout(12, 1, 3)
    assert BatchLayout(12, 1, 3).halved() == BatchLayout(12, 1, 1)
    assert BatchLayout(8, 1, 1).halved() is None
    # a pipeline's micro-batches halve by running twice as many of them
    assert BatchLayout(16, 2, 2, pp=2, pipeline_microbatches=4).halved() == BatchLayout(16, 2, 1, 2, 8)


def test_the_memory_it_lacked_is_read_from_cudas_message():
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
               "1.05 GiB is free. Including non-PyTorch memory, this process has 78.1 GiB memory in use.")
    assert lacked(message) == "it tried to allocate 2.00 GiB with 1.05 GiB free"


@pytest.mark.parametrize("layout,fault", [(["parallel=single"], "oom:3:micro=4"),
                                          (["parallel=ddp", "launcher.nproc_per_node=2"], "oom:3:micro=4:rank=1")],
                         ids=["single", "ddp2-one-rank"])
def test_out_of_memory_at_micro_batch_4_goes_on_at_2(tmp_path, single_reference, layout, fault):
    """Steps 1-2 at micro-batch 4; step 3 fails there (under DDP on rank 1 only: rank 0 must agree to retry)
    and runs again at 2, as do all later steps. The reference trains at micro-batch 2 throughout (FAST)."""
    run_dir = tmp_path / "run"
    proc = run_framework([*MICRO4, *layout], run_dir, env={"FRAMEWORK_FAULT": fault})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running it again at micro-batch 2" in proc.stderr
    records = read_metrics(run_dir)
    assert [r["micro_batch_size"] for r in records] == [4, 4, 2, 2, 2, 2, 2, 2]
    assert max_rel_diff([r["loss"] for r in records], single_reference()) < 1e-6


def test_at_micro_batch_1_it_stops_naming_what_it_lacked(tmp_path):
    proc = run_framework([*FAST, "trainer.on_oom=retry"], tmp_path / "run", env={"FRAMEWORK_FAULT": "oom:2:micro=*"})
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: trainer.on_oom: out of memory at micro-batch 1 in step 2 (rank 0: it tried to allocate "
                      "64.00 MiB with 32.00 MiB free); make the model take less memory per GPU: "
                      "activation_checkpointing=full, zero=stage3, parallel.tp or parallel.pp"], proc.stderr[-3000:]
