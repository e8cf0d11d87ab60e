"""The how-to commands that need this session's MLflow server or check a production feature run as written
(the environment assignments before them too), from a directory other than the checkout, shortened to 2 steps
(tests/harness/docs_commands.py RUN_BY names them). MLFLOW_TRACKING_URI points at the session's own server, as the
page's `export` line does at the one it starts. Each runs in README's environment plus the extras its page installs."""
import json
import math
import shlex

import pytest

from tests.harness import docs_commands
from tests.harness.helpers import run_framework
from tests.docs.test_docs_commands import SHORTEN

COMMANDS = docs_commands.run_by(__file__)


def test_the_pages_show_the_commands_this_module_runs():
    assert {c.page for c in COMMANDS} == {"docs/how-to/tracking.md", "docs/how-to/production.md"} and len(COMMANDS) >= 4


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.text[-60:])
def test_howto_command_runs(tmp_path, mlflow_server, command):
    words = shlex.split(command.text)
    assignments = dict(w.split("=", 1) for w in words[:words.index("python")])
    args = words[words.index("python") + 3:]
    env = {**docs_commands.environment(command), "MLFLOW_TRACKING_URI": mlflow_server, **assignments}
    proc = run_framework([*args, *SHORTEN], cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    [metrics] = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["step"] == 2 and math.isfinite(last["loss"]), (command, last)
