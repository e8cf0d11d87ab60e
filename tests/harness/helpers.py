"""Run the real entrypoint in a subprocess and read what it wrote."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.harness import job_client

REPO = Path(__file__).resolve().parents[2]

# A tiny model and short sequences: every layout finishes in seconds on two CPU cores.
FAST = [
    "model=tiny", "data.seq_len=32", "trainer.max_steps=8", "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2", "trainer.log_every=1", "trainer.eval_every=0",
    "trainer.progress_bar=false", "logging.trackers=[]", "optimizer.lr=3e-3",
    "scheduler.warmup_steps=2", "checkpoint.enabled=false",
]

# DeepSpeed jobs that several files read, trained once per session by conftest's trained_run (2 workers,
# the default): parity and per-stage memory (test_deepspeed), resume and manifests (test_checkpoint),
# export (test_export). Stage 2 also adopts a user's ds_config file; stage 3 partitions every parameter
# (threshold 0: by default tiny ones stay whole on each rank) and checkpoints activations.
DEEPSPEED_Z2 = ("parallel=deepspeed", "zero=stage2",
                f"parallel.ds_config={REPO / 'tests' / 'fixtures' / 'deepspeed' / 'good.json'}")
DEEPSPEED_Z3 = ("parallel=deepspeed", "zero=stage3", "parallel.stage3_param_persistence_threshold=0",
                "activation_checkpointing=full")


def run_framework(args: list[str], run_dir: Path | None = None, timeout: float = 300,
                  torchrun_nproc: int | None = None, env: dict | None = None,
                  module: str = "framework", cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m framework ARGS hydra.run.dir=RUN_DIR` in `cwd`, or the same under torchrun. Forked from the
    session's job server (tests/harness/job_server.py) where the job's environment lets it, a new interpreter
    otherwise: the same job either way."""
    if run_dir is not None:
        args = [*args, f"hydra.run.dir={run_dir}"]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if not torchrun_nproc and job_client.serves(full_env):
        return job_client.run(module, args, cwd, full_env, timeout)
    cmd = [sys.executable]
    if torchrun_nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun_nproc}"]
    cmd += ["-m", module, *args]
    return run_in_own_session(cmd, cwd=cwd, env=full_env, timeout=timeout)


def run_in_own_session(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, except that on timeout the whole process group goes (a hung job's workers too)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            expired.session = proc.pid          # the job's session, which its workers share
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"


def read_metrics(run_dir: Path) -> list[dict]:
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir)]


def max_rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, f"different lengths: {len(a)} vs {len(b)}"
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))


def train(tmp_path: Path, name: str, args: list[str], **kwargs) -> list[float]:
    """Run a job with FAST defaults plus ARGS; return its per-step losses."""
    run_dir = tmp_path / name
    check_ok(run_framework([*FAST, *args], run_dir, **kwargs))
    return losses(run_dir)


#: FAST saves no checkpoint; a job that saves its last step lets tests/harness/parity.py compare every parameter
#: with its reference's (a fraction of a second for the tiny model)
SAVE_LAST = "checkpoint.enabled=true"


def train_run(tmp_path: Path, name: str, args: list[str], **kwargs) -> Path:
    """Run a job with FAST defaults plus ARGS, saving its last step; return its run dir."""
    run_dir = tmp_path / name
    check_ok(run_framework([*FAST, SAVE_LAST, *args], run_dir, **kwargs))
    return run_dir


def assert_planned_model_states(run_dir: Path) -> None:
    """The planner's model-state bytes for the job's resolved config equal what rank 0 measured."""
    from omegaconf import OmegaConf

    from framework.plan.layout import layout_of
    from framework.plan.model_states import model_states
    from framework.plan.shapes import rank_parameters
    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    last = read_metrics(run_dir)[-1]
    layout = layout_of(cfg, last["world_size"])
    planned = model_states(cfg, layout, rank_parameters(cfg, layout, pp_rank=0))
    got = {"params": planned.params, "grads": planned.grads, "optimizer": planned.optimizer, "master": planned.master}
    measured = {"params": last["param_bytes"], "grads": last["grad_bytes"], "optimizer": last["optim_state_bytes"],
                "master": last.get("master_param_bytes", 0)}
    assert got == measured, (layout.describe(), got, measured)


def counters_env(run_dir: Path) -> dict:
    """Env that loads tests/fixtures/counters/sitecustomize.py into every process of a job: each rank then
    writes what it handed to collectives and what autograd saved, per step, under RUN_DIR/counters."""
    # after the path the tests run with: a sitecustomize there (tests/fixtures/planted) runs this one too
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO / "tests" / "fixtures" / "counters"))
                           if p)
    return {"FRAMEWORK_TEST_COUNTERS": str(Path(run_dir) / "counters"), "PYTHONPATH": path}


def counted(run_dir: Path) -> dict[int, list[dict]]:
    """rank -> per optimizer step {"comm": {"<group ranks>|<collective>": bytes}, "calls": {the same keys: how
    many calls}, "saved": peak bytes}."""
    out = {}
    for path in sorted((Path(run_dir) / "counters").glob("counters_rank*.json")):
        record = json.loads(path.read_text())
        out[record["rank"]] = record["steps"]
    return out


def _mesh_dim(layout, ranks: list[int]) -> str:
    """The mesh dimension a group spans, from its ranks (mesh dims outermost first: pp, dp_replicate,
    dp_shard, cp, tp; DDP and DeepSpeed groups are the data-parallel world)."""
    if layout.strategy in ("ddp", "deepspeed", "single"):
        return "dp"
    sizes = {"pp": layout.pp, "dp_replicate": layout.dp_replicate, "dp_shard": layout.dp_shard, "cp": layout.cp,
             "tp": layout.tp}

    def coords(rank):
        out = {}
        for dim in reversed(list(sizes)):
            rank, out[dim] = divmod(rank, sizes[dim])
        return out
    varying = [d for d in sizes if len({coords(r)[d] for r in ranks}) > 1]
    if set(varying) == {"dp_replicate", "dp_shard"}:
        return "dp"
    if set(varying) == {"dp_shard", "cp"}:
        return "dp_shard_cp"
    return "+".join(varying) or "self"


def _pp_rank(layout, rank: int) -> int:
    return rank // (layout.world // layout.pp)


def comm_by_rank(run_dir: Path) -> dict[int, tuple[dict, dict]]:
    """rank -> (planned, counted) bytes per step by "<mesh dim>/<collective>"; counted is the mean of the
    steps after the first (the first also holds setup: DDP's first buckets, pipeline shape exchange)."""
    from omegaconf import OmegaConf

    from framework.plan.comm import comm_bytes
    from framework.plan.layout import layout_of
    from framework.plan.planner import _kv_dim, _model_dims, holds_head
    from framework.plan.shapes import rank_parameters
    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    layout = layout_of(cfg, read_metrics(run_dir)[-1]["world_size"])
    hidden, vocab, n_layers = _model_dims(cfg)
    out = {}
    for rank, steps in counted(run_dir).items():
        later = steps[1:]
        assert later, f"rank {rank} counted {len(steps)} step(s)"
        got: dict[str, float] = {}
        for step in later:
            for key, nbytes in step["comm"].items():
                ranks, collective = key.split("|")
                name = f"{_mesh_dim(layout, [int(r) for r in ranks.split(',')])}/{collective}"
                got[name] = got.get(name, 0) + nbytes / len(later)
        pp_rank = _pp_rank(layout, rank)
        planned = comm_bytes(layout, rank_parameters(cfg, layout, pp_rank), hidden, vocab, n_layers,
                             last_stage=holds_head(layout, pp_rank), kv_dim=_kv_dim(cfg))
        if layout.cp > 1 and layout.dp_shard == 1:     # FSDP's group is the cp group: one counter for both
            for key in [k for k in planned if k.startswith("dp_shard_cp/")]:
                cp_key = "cp/" + key.split("/")[1]
                planned[cp_key] = planned.get(cp_key, 0) + planned.pop(key)
        out[rank] = (planned, got)
    assert len(out) == layout.world, f"counters from {sorted(out)} of {layout.world} ranks"
    return out


def assert_planned_comm(run_dir: Path, rel: float = 0.05) -> None:
    """Every rank's communication bytes per step, as the planner predicts them for the job's resolved
    config, are within REL of what the counters saw its collectives move: each collective of each mesh
    dimension; what the planner leaves out (a loss or norm scalar) must stay under 1% of the total."""
    for rank, (planned, got) in comm_by_rank(run_dir).items():
        total = sum(got.values())
        for key in set(planned) | set(got):
            want, have = planned.get(key, 0), got.get(key, 0)
            if key not in planned:
                assert have <= 0.01 * total, (rank, key, planned, got)
            else:
                assert abs(want - have) <= rel * max(want, have), (rank, key, planned, got)


def saved_by_rank(run_dir: Path) -> dict[int, tuple[int, list[int]]]:
    """rank -> (the planner's activation bytes for that rank, the peak bytes autograd held saved in each
    step after the first)."""
    from omegaconf import OmegaConf

    from framework.plan.layout import layout_of
    from framework.plan.planner import _activations
    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    layout = layout_of(cfg, read_metrics(run_dir)[-1]["world_size"])
    out = {}
    for rank, steps in counted(run_dir).items():
        held, _ = _activations(cfg, layout, _pp_rank(layout, rank))
        out[rank] = (held, [step["saved"] for step in steps[1:]])
    return out


def assert_planned_activations(run_dir: Path, rel: float = 0.10) -> None:
    """Every rank's planned activation bytes are within REL of the peak autograd actually held saved."""
    for rank, (planned, peaks) in saved_by_rank(run_dir).items():
        assert peaks and all(abs(planned - peak) <= rel * max(planned, peak) for peak in peaks), (rank, planned, peaks)


def derive_and_validate(cfg, world_size: int, strategy_cls, run_dir: str | None = None,
                        explicit: set[str] | None = None) -> None:
    """What admission does to a composed config once its strategy and world are known: the derivations
    (framework.config.derive, written into cfg), then every validation rule."""
    from framework.config.validate import validate
    from framework.config.derive import derive
    derive(cfg, world_size, strategy_cls, explicit)
    validate(cfg, world_size, strategy_cls, run_dir, explicit)


def validate_composed(cfg) -> None:
    """The launcher's checks on a composed config, at the world size its strategy would start."""
    from framework.runtime import world
    from framework.strategies.registry import strategy_class
    cls = strategy_class(cfg.parallel.name)
    derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
