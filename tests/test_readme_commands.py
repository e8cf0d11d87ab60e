"""Every `python -m framework ...` line in README.md's code blocks runs as written, from a directory
other than the checkout, shortened to 2 steps, and ends with a finite loss and validation loss (the
mission's `parallel=3d zero=stage3` included: 8 workers, tp 2 x pp 2 x dp_shard 2). Lines that need a GPU, torchrun or a file of the user's
(data.path, checkpoint.initial_load, ...) or a SLURM cluster are left out (the SLURM line is checked against a
fake sbatch in test_submitit). Slow-ish: several are multi-process."""
import json
import math
import os
import re
import shlex
import sys

import pytest

from tests.helpers import REPO, run_in_own_session

SHORTEN = ["trainer.max_steps=2", "trainer.eval_batches=1", "trainer.progress_bar=false"]
NEEDS_USER_FILES = ("data.path", "initial_load", "checkpoint.resume=", "outputs/", "model.pretrained=")
NEEDS_A_CLUSTER = ("hydra/launcher=slurm",)
RUN_BY_TEST_PLAN = ("parallel=auto",)   # test_plan runs it as written and checks the pick it wrote down


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("python -m framework ") or line == "python -m framework":
                if not any(marker in line for marker in NEEDS_USER_FILES + NEEDS_A_CLUSTER + RUN_BY_TEST_PLAN):
                    commands.append(line)
    return commands


COMMANDS = readme_commands()


def test_the_readme_shows_the_examples_this_module_runs():
    assert len(COMMANDS) >= 7 and "python -m framework" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(tmp_path, command):
    args = shlex.split(command)[3:]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = run_in_own_session([sys.executable, "-m", "framework", *args, *SHORTEN], cwd=tmp_path, env=env,
                              timeout=1200)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    runs = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    assert runs, "no run dir under the working directory"
    for metrics in runs:
        last = json.loads(metrics.read_text().splitlines()[-1])
        # the default evaluates at the last step: through the pipeline too, for parallel=3d
        assert last["step"] == 2 and math.isfinite(last["loss"]) and math.isfinite(last["val_loss"]), (command, last)
