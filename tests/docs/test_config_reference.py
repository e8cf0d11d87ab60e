"""docs/reference/config.md is what `python -m framework.reference` prints from the code, so a schema change
that was not regenerated fails here; it covers every leaf key that `python -m framework ... --cfg job`
composes for every option of every group (and every recipe), each with a meaning; and `--help`, which
prints from the same descriptions, points to it. The docs' `--help` and `--cfg job` commands run as
written."""
import io
import os
import re
import shlex
import sys
from contextlib import redirect_stdout

import yaml

from framework import reference
from framework.config import schema
from framework.config.help import REFERENCE, help_text, sections, user_groups
from tests.harness.docs_commands import environment, run_by
from tests.harness.helpers import REPO, check_ok, run_in_own_session

PAGE = REPO / REFERENCE
REGENERATE = f"the schema changed: regenerate the page with `python -m framework.reference > {REFERENCE}`"


def documented(text: str) -> tuple[dict[str, dict[str, set[str]]], dict[str, str]]:
    """From the page: group -> option -> the keys listed for it; and every listed key -> its meaning."""
    by_option: dict[str, dict[str, set[str]]] = {}
    meanings: dict[str, str] = {}
    group, having = None, []
    for line in text.splitlines():
        if line.startswith("## "):
            group = line[3:].strip("`")
            having = []
        elif line.startswith("### Keys of every option"):
            having = ["*"]
        elif line.startswith("### Keys of `"):
            having = [o.strip() for o in line.split("=` ", 1)[1].split(",")]
        elif line.startswith("| `") and group is not None:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            key = cells[0].strip("`")
            if len(cells) == 5:
                meanings[key] = cells[4]
                for option in having:
                    by_option.setdefault(group, {}).setdefault(option, set()).add(key)
            else:       # an options table: | option | what it is | sets |
                meanings[f"{group}={key}"] = cells[1]
    return by_option, meanings


def test_the_page_is_what_the_generator_prints():
    """The docs' `python -m framework.reference > docs/reference/config.md`, in this process."""
    (command,) = [c.text for c in run_by(__file__) if c.text.startswith("python -m framework.reference")]
    assert command == f"python -m framework.reference > {REFERENCE}"
    out = io.StringIO()
    with redirect_stdout(out):
        assert reference.main() == 0
    assert PAGE.read_text() == out.getvalue(), REGENERATE


def test_a_default_changed_in_the_schema_changes_the_page(monkeypatch):
    field = schema.TrainerConfig.__dataclass_fields__["max_steps"]
    monkeypatch.setattr(field, "default", field.default + 1)
    assert reference.page() != PAGE.read_text()


def test_the_page_covers_every_leaf_key_of_every_group_option_and_recipe():
    by_option, meanings = documented(PAGE.read_text())
    every_key = set(meanings)
    checked = 0
    for group, options in user_groups().items():
        for option in options:
            override = f"+{group}={option}" if group == reference.RECIPES else f"{group}={option}"
            keys = reference.leaves(reference.compose((override,)))
            for key in keys:
                listed = by_option.get(group, {})
                if group != reference.RECIPES and key.startswith(f"{group}."):
                    assert key in listed.get("*", set()) | listed.get(option, set()), \
                        f"{override}: {key} is not in the reference's table for it; {REGENERATE}"
                else:
                    assert key in every_key, f"{override}: {key} is not in the reference; {REGENERATE}"
                checked += 1
    assert checked > 1000
    assert all(meanings.values()), f"keys or options without a meaning: {[k for k, v in meanings.items() if not v]}"


def test_the_docs_cfg_job_command_composes_what_the_reference_reads(tmp_path):
    """The in-process composition the reference and the test above use is the one `--cfg job` prints."""
    (command,) = [c for c in run_by(__file__) if "--cfg job" in c.text]
    proc = run_in_own_session([sys.executable, *shlex.split(command.text)[1:]], cwd=tmp_path, timeout=120,
                              env={**os.environ, **environment(command, {"PYTHONPATH": str(REPO)})})
    check_ok(proc)
    printed = reference.leaves(yaml.safe_load(proc.stdout))
    composed = reference.leaves(reference.compose(tuple(shlex.split(command.text)[3:-2])))
    assert printed.keys() == composed.keys() and len(printed) > 100


def test_help_points_to_the_reference_and_shows_the_same_rows(tmp_path):
    (command,) = [c for c in run_by(__file__) if c.text.endswith("--help")]
    proc = run_in_own_session([sys.executable, *shlex.split(command.text)[1:]], cwd=tmp_path, timeout=120,
                              env={**os.environ, **environment(command, {"PYTHONPATH": str(REPO)})})
    check_ok(proc)
    assert proc.stdout.strip() == help_text().strip()
    assert REFERENCE in proc.stdout and "python -m framework.reference" in proc.stdout
    _, meanings = documented(PAGE.read_text())
    rows = [row for part in sections().values() for row in part]
    assert {"trainer.progress_bar", "trainer.eval_batches", "seed", "device"} <= {row.key for row in rows}
    for row in rows:
        assert f"{row.key}={row.default}" in proc.stdout and row.meaning in proc.stdout
        assert meanings.get(row.key) == row.meaning.replace("|", "\\|"), row.key

