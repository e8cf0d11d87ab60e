"""Every command README.md and docs/ show is run by a test, as written (tests/docs_commands.py says which),
and the `python -m framework ...` training commands no other test claims run here: from a directory other
than the checkout, shortened to 2 steps, each ending with a finite loss and validation loss (the mission's
`parallel=3d zero=stage3` included: 8 workers, tp 2 x pp 2 x dp_shard 2). Slow-ish: several are
multi-process."""
import json
import math
import shlex

import pytest

from tests import docs_commands
from tests.helpers import REPO, run_framework

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True

SHORTEN = ["trainer.max_steps=2", "trainer.eval_batches=1", "trainer.progress_bar=false"]
COMMANDS = docs_commands.run_by(docs_commands.GENERIC)


def test_every_command_the_docs_show_is_run_by_a_test_or_says_what_it_needs():
    uncovered = [f"{c.page}: {c}" for c in docs_commands.commands() if docs_commands.owner(c) is None]
    assert not uncovered, ("no test runs these; give them a marker in tests/docs_commands.py RUN_BY (and run them "
                           "there) or NEEDS:\n" + "\n".join(uncovered))
    for _, test in docs_commands.RUN_BY:
        assert "run_by(" in (REPO / test).read_text(), f"{test} is named in RUN_BY but never asks run_by() for its commands"


def test_the_docs_show_the_examples_this_module_runs():
    texts = [c.text for c in COMMANDS]
    assert len(texts) >= 10 and "python -m framework" in texts and "python -m framework parallel=3d zero=stage3" in texts


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.text[len("python -m framework "):][:60] or "default")
def test_docs_command_runs(tmp_path, command):
    args = shlex.split(command.text)[3:]
    # as a user runs it: the installed package, from a directory of their own
    proc = run_framework([*args, *SHORTEN], cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, f"{command.page}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    runs = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    assert runs, "no run dir under the working directory"
    for metrics in runs:
        last = json.loads(metrics.read_text().splitlines()[-1])
        # the default evaluates at the last step: through the pipeline too, for parallel=3d
        assert last["step"] == 2 and math.isfinite(last["loss"]) and math.isfinite(last["val_loss"]), (command, last)
