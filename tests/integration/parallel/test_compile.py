"""trainer.compile=true: torch.compile per block gives the eager single-process run (fp32, 8 steps)
under single, ddp x2, fsdp x2, 3d pp2 and 3d tp2 (with and without sequence parallelism); compilation
time is logged apart from step time; DeepSpeed is refused with the reason."""
import pytest

from tests.harness.helpers import FAST, SAVE_LAST, check_ok, read_metrics, run_framework
from tests.harness.parity import assert_parity

LAYOUTS = {
    "single": ["parallel=single"],
    "ddp": ["parallel=ddp"],
    "fsdp": ["parallel=fsdp", "zero=stage3"],
    "3d_pp2": ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=1"],
    "3d_tp2": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"],
    "3d_tp2_sp": ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1",
                  "parallel.sequence_parallel=true"],
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_compiled_blocks_match_eager_single(tmp_path, reference_run, name):
    run_dir = tmp_path / name
    check_ok(run_framework([*FAST, SAVE_LAST, *LAYOUTS[name], "trainer.compile=true"], run_dir, timeout=600))
    assert assert_parity(run_dir, reference_run())["kind"] == "fp32-compiled"
    records = read_metrics(run_dir)
    assert records[0]["compile_time"] > 0 and records[0]["compiled_graphs"] >= 1
    # compilation is logged on its own and happens in the first steps only (no recompiles)
    assert all(r["compile_time"] == 0 for r in records[2:]), [r["compile_time"] for r in records]


@pytest.mark.parametrize("args,expected", [
    (["parallel=deepspeed"], "error: trainer.compile: parallel=deepspeed cannot use trainer.compile: "),
], ids=["deepspeed"])
def test_compile_is_refused_where_it_cannot_work(tmp_path, args, expected):
    proc = run_framework(["model=tiny", *args, "trainer.compile=true"], tmp_path / "run", timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
