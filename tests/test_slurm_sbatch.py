"""README's sbatch script runs as written under a fake srun (tests/fakes/srun: one node, 2 CPU tasks with
srun's variables), shrunk by overrides given after the script's name as `sbatch train.sbatch ARGS` would
pass them. A first attempt stops after a checkpoint; the job's second attempt (same SLURM job id, a
requeue) finds it in the job's run dir and resumes, saying so."""
import json
import os
import random
import re
import shutil
import subprocess
import sys

from tests.helpers import REPO

FAKES = REPO / "tests" / "fakes"
SHRINK = ["model=tiny", "data=synthetic", "data.seq_len=32", "data.vocab_size=256", "device=cpu", "precision=fp32",
          "parallel.dp_replicate=1", "activation_checkpointing=none", "trainer.max_steps=2",
          "trainer.global_batch_size=4", "trainer.eval_every=0", "trainer.progress_bar=false",
          "logging.tensorboard=false", "checkpoint.interval=1"]


def sbatch_script() -> str:
    blocks = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    scripts = [b for b in blocks if "#SBATCH" in b]
    assert len(scripts) == 1, "README shows one sbatch script"
    return scripts[0]


def test_readme_sbatch_script_asks_for_what_the_text_says():
    script = sbatch_script()
    for directive in ("--nodes=4", "--ntasks-per-node=8", "--gpus-per-node=8", "--requeue", "--signal=USR1@"):
        assert f"#SBATCH {directive}" in script
    assert "srun python -m framework +recipe=llama3_8b" in script and "checkpoint.resume=auto" in script


def _script(path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def _attempt(tmp_path, job_id: str, *extra: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        shutil.copy(FAKES / "srun", bin_dir / "srun")
        # `python` is this test's interpreter (a wrapper, not a link: a venv is found from the path run)
        _script(bin_dir / "python", f'exec {sys.executable} "$@"')
        _script(bin_dir / "scontrol", f'echo "$@" >> {tmp_path}/scontrol.log')
        (tmp_path / "train.sbatch").write_text(sbatch_script())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
               FAKE_SRUN_NTASKS="2")
    return subprocess.run(["bash", "train.sbatch", *SHRINK, *extra], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def test_readme_sbatch_script_runs_and_its_requeued_attempt_resumes(tmp_path):
    job_id = str(random.randrange(10**6, 10**7))   # the rendezvous port derives from it: apart from other runs
    first = _attempt(tmp_path, job_id, "trainer.stop_at_step=1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-4000:]
    run_dir = tmp_path / "outputs" / "slurm" / job_id
    assert (run_dir / "checkpoints" / "step_00000001").is_dir(), sorted(p.name for p in tmp_path.rglob("*"))
    assert "no complete checkpoint, starting at step 0" in first.stdout

    second = _attempt(tmp_path, job_id, "trainer.stop_at_step=null")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    said = [line for line in second.stdout.splitlines() if line.startswith("checkpoint.resume=auto")]
    checkpoints = run_dir / "checkpoints"
    assert said == [f"checkpoint.resume=auto: looked in {checkpoints}: resuming from {checkpoints}/step_00000001"], \
        second.stdout[-2000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == [1, 2]
    assert not (tmp_path / "scontrol.log").exists()   # a finished attempt does not requeue itself
