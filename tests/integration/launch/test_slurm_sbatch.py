"""The sbatch script of docs/how-to/slurm.md runs as written under a fake srun (tests/fakes/srun: one node, 2 CPU tasks with
srun's variables), shrunk by overrides given after the script's name as `sbatch train.sbatch ARGS` would
pass them. A first attempt gets SLURM's --signal (USR1 to every task), saves a checkpoint, exits 143 and
requeues itself (a fake scontrol records it); the job's second attempt (same SLURM job id) finds the
checkpoint in the job's run dir and resumes, saying so."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from tests.harness.docs_commands import bash_blocks, environment, logical_lines, pages, run_by
from tests.harness.helpers import REPO

FAKES = REPO / "tests" / "fakes"
SHRINK = ["model=tiny", "data=synthetic", "data.seq_len=32", "data.vocab_size=256", "device=cpu", "precision=fp32",
          "parallel.dp_replicate=1", "activation_checkpointing=none", "trainer.max_steps=30",
          "trainer.global_batch_size=4", "trainer.eval_every=0", "trainer.progress_bar=false",
          "logging.trackers=[]", "trainer.log_every=1", "checkpoint.interval=1000"]


def sbatch_script() -> str:
    """The docs' sbatch script of one srun task per GPU: the block of the srun command this test runs
    (tests/integration/launch/test_torchrun_requeue.py runs the one of one torchrun per node)."""
    (srun,) = run_by(__file__)
    scripts = [b for path in pages() for b in bash_blocks(path) if "#SBATCH" in b and srun.text in logical_lines(b)]
    assert len(scripts) == 1, "the docs show one sbatch script of srun tasks"
    assert srun.text in logical_lines(scripts[0])
    return scripts[0]


def test_docs_sbatch_script_asks_for_what_the_text_says():
    script = sbatch_script()
    for directive in ("--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "--requeue", "--signal=USR1@"):
        assert f"#SBATCH {directive}" in script
    assert "srun python -m framework +recipe=llama3_8b" in script and "checkpoint.resume=auto" in script


def _script(path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _attempt(tmp_path, job_id: str, signal_after_steps: int | None = None) -> subprocess.CompletedProcess:
    """`sbatch train.sbatch SHRINK...` as SLURM starts it on one node; with signal_after_steps, SLURM's
    --signal=USR1 reaches srun's tasks once that many steps are logged."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        shutil.copy(FAKES / "srun", bin_dir / "srun")
        # `python` is this test's interpreter (a wrapper, not a link: a venv is found from the path run)
        _script(bin_dir / "python", f'exec {sys.executable} "$@"')
        _script(bin_dir / "scontrol", f'echo "$@" >> {tmp_path}/scontrol.log')
        (tmp_path / "train.sbatch").write_text(sbatch_script())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env.update(environment(run_by(__file__)[0], {"PYTHONPATH": str(REPO)}))   # README's install plus the page's extras
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONUNBUFFERED="1",
               SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
               FAKE_SRUN_NTASKS="2", FAKE_SRUN_PIDFILE=str(tmp_path / "srun.pid"))
    proc = subprocess.Popen(["bash", "train.sbatch", *SHRINK], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if signal_after_steps is not None:
        metrics = tmp_path / "outputs" / "slurm" / job_id / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and \
                (not metrics.exists() or len(metrics.read_text().splitlines()) < signal_after_steps):
            time.sleep(0.02)
        os.kill(int((tmp_path / "srun.pid").read_text()), signal.SIGUSR1)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _steps(run_dir) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def test_docs_sbatch_script_runs_is_requeued_on_its_signal_and_resumes(tmp_path):
    job_id = str(random.randrange(10**6, 10**7))   # the rendezvous port derives from it: apart from other runs
    run_dir = tmp_path / "outputs" / "slurm" / job_id
    first = _attempt(tmp_path, job_id, signal_after_steps=2)
    assert first.returncode == 143, first.stdout[-2000:] + first.stderr[-4000:]
    assert "no complete checkpoint, starting at step 0" in first.stdout
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    stopped_at = len(_steps(run_dir))
    assert 2 <= stopped_at < 30 and saved == [f"step_{stopped_at:08d}"], "the signal came after the run ended"
    assert (tmp_path / "scontrol.log").read_text() == f"requeue {job_id}\n"

    second = _attempt(tmp_path, job_id)      # the requeued job: same job id, same script and arguments
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    said = [line for line in second.stdout.splitlines() if line.startswith("checkpoint.resume=auto")]
    checkpoints = run_dir / "checkpoints"
    assert said == [f"checkpoint.resume=auto: looked in {checkpoints}: resuming from {checkpoints}/{saved[0]}"], \
        second.stdout[-2000:]
    assert _steps(run_dir) == list(range(1, 31))
    assert (tmp_path / "scontrol.log").read_text() == f"requeue {job_id}\n"   # a finished job does not requeue
