"""Every `python -m framework ...` line of docs/how-to/moe.md runs as written from a directory other than the
checkout, in README's environment, shortened to 2 steps, and ends with a finite loss."""
import json
import math
import shlex

import pytest

from tests.harness.docs_commands import environment, run_by
from tests.harness.helpers import run_framework

SHORTEN = ["trainer.max_steps=2", "trainer.eval_batches=1", "trainer.progress_bar=false"]


def page_commands() -> list:
    return run_by(__file__)


def test_the_page_shows_commands():
    assert len(page_commands()) >= 2


@pytest.mark.parametrize("command", page_commands(), ids=str)
def test_page_command_runs(tmp_path, command):
    proc = run_framework([*shlex.split(command.text)[3:], *SHORTEN], cwd=tmp_path, timeout=600,
                         env=environment(command))
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-4000:]}"
    runs = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    assert len(runs) == 1, runs
    last = json.loads(runs[0].read_text().splitlines()[-1])
    assert last["step"] == 2 and math.isfinite(last["loss"]), (command, last)
