"""parallel=deepspeed end to end: real DeepSpeed on its CPU accelerator, 2 workers over gloo.

FAST gives global batch 8 and micro batch 2, so 2 workers accumulate 2 micro-batches per step.
"""
import json
import sys

import pytest

from tests.harness.helpers import (DEEPSPEED_Z2, DEEPSPEED_Z3, FAST, REPO, SAVE_LAST, assert_planned_model_states,
                                   check_ok, losses, read_metrics, run_framework, run_in_own_session)
from tests.harness.parity import assert_parity

FIXTURES = REPO / "tests" / "fixtures" / "deepspeed"

RUNS = {
    "none": ["zero=none"],
    "stage1": ["zero=stage1"],
    "offload": ["zero=stage2", "zero.offload_optimizer=true", f"parallel.ds_config={FIXTURES / 'auto.json'}"],
}
SHARED = {"stage2": DEEPSPEED_Z2, "stage3": DEEPSPEED_Z3}   # with checkpoints, which the other files read
_runs: dict[str, object] = {}


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory, trained_run):
    """Run dir of a 2-worker DeepSpeed job per RUNS or SHARED entry, each run once per session."""
    def get(name: str):
        if name in SHARED:
            return trained_run(*SHARED[name])
        if name not in _runs:
            run_dir = tmp_path_factory.mktemp(f"ds_{name}")
            check_ok(run_framework([*FAST, SAVE_LAST, "parallel=deepspeed", "launcher.nproc_per_node=2", *RUNS[name]],
                                   run_dir))
            _runs[name] = run_dir
        return _runs[name]
    return get


@pytest.mark.parametrize("name", ["none", "stage1", "stage2", "stage3"])
def test_fp32_loss_parity_with_single(ds_run, reference_run, name):
    assert len(losses(ds_run(name))) == 8
    assert_parity(ds_run(name), reference_run())


def test_optimizer_offload_parity_with_single(ds_run, reference_run):
    run_dir = ds_run("offload")
    assert_parity(run_dir, reference_run())        # the offloaded states step with torch's AdamW, in fp32
    # The "auto" file was filled from the run.
    ds = json.loads((run_dir / "ds_config.json").read_text())
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"]) == (8, 2)
    assert "auto" not in json.dumps(ds)


def test_written_config_matches_the_run(ds_run):
    run_dir = ds_run("stage1")
    ds = json.loads((run_dir / "ds_config.json").read_text())
    world = 2
    assert ds["train_batch_size"] == 8 == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (2, 2)
    assert ds["zero_optimization"]["stage"] == 1 and ds["gradient_clipping"] == 1.0
    assert ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    # The good file's own knob reached DeepSpeed.
    ds2 = json.loads((ds_run("stage2") / "ds_config.json").read_text())
    assert ds2["zero_optimization"]["reduce_bucket_size"] == 2000000 and ds2["wall_clock_breakdown"] is False


def test_per_rank_memory_shrinks_with_the_stage(ds_run):
    mem = {name: read_metrics(ds_run(name))[-1] for name in ("none", "stage1", "stage2", "stage3")}
    opt = {k: m["optim_state_bytes"] for k, m in mem.items()}
    params = {k: m["param_bytes"] for k, m in mem.items()}
    grads = {k: m["grad_bytes"] for k, m in mem.items()}
    master = {k: m["master_param_bytes"] for k, m in mem.items()}
    half = pytest.approx(params["none"] / 2, rel=0.01)        # 1/N of the model, N=2 (plus a little padding)
    # ZeRO-1/2/3 keep 1/N of AdamW's two moments per rank.
    assert opt["none"] == pytest.approx(2 * params["none"], rel=0.01), opt
    for stage in ("stage1", "stage2", "stage3"):
        assert opt[stage] == pytest.approx(opt["none"] / 2, rel=0.01), opt
    # ZeRO-1/2 step an fp32 copy of their partition; ZeRO-3 in fp32 steps the parameter partition itself.
    assert master["none"] == 0 and master["stage1"] == half and master["stage2"] == half, master
    assert master["stage3"] == 0, master
    # Stage 2 also partitions gradients; stage 3 also parameters.
    assert grads["none"] == params["none"] and grads["stage2"] == half, grads
    assert params["stage1"] == params["stage2"] == params["none"] and params["stage3"] == half, params
    for name in ("none", "stage1", "stage2", "stage3", "offload"):
        assert_planned_model_states(ds_run(name))


def test_bf16_runs_and_learns_on_the_default_corpus(tmp_path, reference_run):
    run_dir = tmp_path / "bf16"
    check_ok(run_framework([*FAST, SAVE_LAST, "parallel=deepspeed", "zero=stage2", "precision=bf16"], run_dir))
    got = losses(run_dir)
    assert len(got) == 8 and all(x == x for x in got)
    assert got[-1] < got[0] - 0.3, got
    assert assert_parity(run_dir, reference_run())["kind"] == "bf16"
    assert json.loads((run_dir / "ds_config.json").read_text())["bf16"]["enabled"] is True


def test_engine_checkpoint_round_trip_and_fp32_export(tmp_path):
    args = [*FAST[:5], "optimizer.lr=3e-3", "scheduler.warmup_steps=2", "parallel=deepspeed", "zero=stage3",
            "parallel.stage3_param_persistence_threshold=0"]
    proc = run_in_own_session([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(FIXTURES / "checkpoint_roundtrip.py"), str(tmp_path), *args],
                          cwd=REPO, timeout=300)
    check_ok(proc)
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert out["a"] == out["b"]                                   # loss, lr and grad norm after load
    assert out["keys"] == out["plain_keys"] and out["dtypes"] == ["torch.float32"]
    assert out["plain_loss"] == pytest.approx(out["engine_loss"], rel=1e-6)
    assert any("optim_states" in f for f in out["files"])


def _rejected(tmp_path, args):
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, "parallel=deepspeed", *args], run_dir, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())
    return proc.stderr


def test_contradicting_file_exits_2_naming_both_values(tmp_path):
    err = _rejected(tmp_path, [f"parallel.ds_config={FIXTURES / 'contradicting.json'}"])
    assert "train_batch_size=16 contradicts trainer.global_batch_size=8" in err


def test_seed_example_fails_clearly_on_cpu(tmp_path):
    err = _rejected(tmp_path, [f"parallel.ds_config={FIXTURES / 'seed_ds_config.json'}"])
    assert err.startswith("error: parallel.ds_config") and len(err.strip().splitlines()) == 1
    assert "fp16.enabled=true cannot run on this machine" in err
    assert "train_batch_size=256 contradicts trainer.global_batch_size=8" in err


@pytest.mark.parametrize("name", ["ds_config_zero2", "ds_config_zero3"])
def test_public_auto_file_runs_with_no_other_override(tmp_path, name):
    run_dir = tmp_path / name
    check_ok(run_framework(["parallel=deepspeed", f"parallel.ds_config={FIXTURES / (name + '.json')}",
                            "model=tiny", "data.seq_len=32", "trainer.max_steps=2", "trainer.eval_every=0",
                            "trainer.progress_bar=false", "logging.trackers=[]"], run_dir))
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    written = json.loads((run_dir / "ds_config.json").read_text())
    assert written["zero_optimization"]["stage"] == int(name[-1]) and written["scheduler"]["type"] == "WarmupLR"


def test_fixed_fp16_file_is_refused_on_cpu_in_one_line(tmp_path):
    err = _rejected(tmp_path, [f"parallel.ds_config={FIXTURES / 'ds_config_zero2_fp16.json'}"])
    assert len(err.strip().splitlines()) == 1 and "fp16.enabled=true cannot run on this machine" in err
