"""Run the real entrypoint in a subprocess and read what it wrote."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A tiny model and short sequences: every layout finishes in seconds on two CPU cores.
FAST = [
    "model=tiny", "data.seq_len=32", "trainer.max_steps=8", "trainer.global_batch_size=8",
    "trainer.micro_batch_size=2", "trainer.log_every=1", "trainer.eval_every=0",
    "trainer.progress_bar=false", "logging.tensorboard=false", "optimizer.lr=3e-3",
    "scheduler.warmup_steps=2", "checkpoint.enabled=false",
]


def run_framework(args: list[str], run_dir: Path | None = None, timeout: float = 300,
                  torchrun_nproc: int | None = None, env: dict | None = None,
                  module: str = "framework") -> subprocess.CompletedProcess:
    """`python -m framework ARGS hydra.run.dir=RUN_DIR`, or the same under torchrun."""
    cmd = [sys.executable]
    if torchrun_nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun_nproc}"]
    cmd += ["-m", module, *args]
    if run_dir is not None:
        cmd.append(f"hydra.run.dir={run_dir}")
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return run_in_own_session(cmd, cwd=REPO, env=full_env, timeout=timeout)


def run_in_own_session(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, except that on timeout the whole process group goes (a hung job's workers too)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
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
