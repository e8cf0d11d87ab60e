"""Every `python -m framework ...` line of the how-to pages this file names runs as written (with the
environment assignments before it), from a directory other than the checkout, shortened to 2 steps.
MLFLOW_TRACKING_URI points at the session's own server, as the page's `export` line does at the one it starts."""
import json
import math
import os
import re
import shlex
import sys

import pytest

from tests.helpers import REPO, run_in_own_session
from tests.test_readme_commands import SHORTEN

PAGES = ("docs/how-to/tracking.md", "docs/how-to/production.md")


def page_commands(page: str) -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / page).read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if re.match(r"^([A-Z_]+=\S+ )*python -m framework( |$)", line):
                commands.append(line)
    return commands


COMMANDS = [(page, command) for page in PAGES for command in page_commands(page)]


def test_the_pages_show_the_commands_this_module_runs():
    assert [page for page, _ in COMMANDS] == [PAGES[0], PAGES[0], PAGES[1], PAGES[1]]


@pytest.mark.parametrize("page,command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_howto_command_runs(tmp_path, mlflow_server, page, command):
    words = shlex.split(command)
    assignments = dict(w.split("=", 1) for w in words[:words.index("python")])
    args = words[words.index("python") + 3:]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": mlflow_server,
           **assignments}
    proc = run_in_own_session([sys.executable, "-m", "framework", *args, *SHORTEN], cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    [metrics] = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert last["step"] == 2 and math.isfinite(last["loss"]), (command, last)
