"""docs/how-to/torchrun-on-slurm.md: its sbatch script runs as written under a fake srun (one node: one task,
`python -m framework.torchrun` with two CPU workers), shrunk by overrides given after the script's name. SLURM's
--signal (USR1) reaches torchrun; the workers save, and the script sees 143 and requeues itself. Under plain
torchrun the same signal killed torchrun (SIGTERM: exit 1 with a SignalException), so it never requeued."""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

from tests.harness.helpers import REPO
from tests.integration.launch.test_slurm_sbatch import FAKES, SHRINK

DOC = REPO / "docs" / "how-to" / "torchrun-on-slurm.md"


def sbatch_script() -> str:
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S) if "#SBATCH" in b]
    assert len(blocks) == 1, "the page shows one sbatch script"
    return blocks[0]


def _script(path, body: str) -> None:
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def test_the_pages_torchrun_sbatch_script_requeues_on_slurms_signal(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FAKES / "srun", bin_dir / "srun")
    _script(bin_dir / "python", f'exec {sys.executable} "$@"')
    _script(bin_dir / "scontrol", f'if [ "$1" = show ]; then echo localhost; else echo "$@" >> {tmp_path}/scontrol.log; fi')
    (tmp_path / "train.sbatch").write_text(sbatch_script())
    job_id = str(random.randrange(10**6, 10**7))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", SLURM_JOB_ID=job_id,
               SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_GPUS_ON_NODE="2",
               FAKE_SRUN_NTASKS="1", FAKE_SRUN_PIDFILE=str(tmp_path / "srun.pid"))
    proc = subprocess.Popen(["bash", "train.sbatch", *SHRINK], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "outputs" / "slurm" / job_id
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and \
            (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.02)
    os.kill(int((tmp_path / "srun.pid").read_text()), signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-2000:] + err[-4000:]
    stopped_at = len(metrics.read_text().splitlines())
    assert 2 <= stopped_at < 30, "the signal came after the run ended"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{stopped_at:08d}"]
    assert "stopped by SIGUSR1 after a checkpoint; exit 143 asks to be requeued" in err
    assert (tmp_path / "scontrol.log").read_text() == f"requeue {job_id}\n"
