"""The docs site builds with `mkdocs build --strict`; README stays one screen; the repository refers to nothing
outside itself; the lists the pages state (options, models, benchmark scripts, measured rows) are what the
code and the files hold; the layers diagram is what the imports draw."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from framework.config.help import user_groups
from tests.tools import layers_diagram
from tests.harness.docs_commands import pages
from tests.harness.helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
# places the repository must not point to: the workspace around a checkout, a home dir
OUTSIDE = re.compile(r"\.\./shared|/work/|shared/(?:DESIGN|gpu)\b|/home/|/Users/")
# everything the repository holds that a reader or the code follows
SCANNED = ("README.md", "mkdocs.yml", "pyproject.toml", "setup.py", ".ci", "docs", "framework", "conf", "recipes",
           "benchmarks", "tests")


def test_mkdocs_builds_the_site_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    for page in ("index.html", "reference/config/index.html", "design/layers/index.html", "how-to/sweeps/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_a_how_to_page_the_nav_does_not_list_yet_is_added_to_its_section(tmp_path):
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "how-to").mkdir()
    (tmp_path / "how-to" / "listed.md").write_text("# Listed\n")
    (tmp_path / "how-to" / "ray.md").write_text("# Ray clusters\n")
    config = {"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"},
                                                {"How-to guides": ["how-to/index.md", {"Listed": "how-to/listed.md"}]}]}
    section = hooks.on_config(config)["nav"][1]["How-to guides"]
    assert section == ["how-to/index.md", {"Listed": "how-to/listed.md"}, {"Ray clusters": "how-to/ray.md"}]


def test_the_readme_is_one_screen_with_its_two_set_up_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines"
    assert len([line for line in lines if line.startswith("python3 -m venv")]) == 2


def _files():
    for name in SCANNED:
        path = REPO / name
        for f in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            if "__pycache__" not in f.parts and f.suffix not in (".png", ".pyc") and f != Path(__file__):
                yield f


def test_nothing_refers_to_a_place_outside_the_repository():
    found = [f"{f.relative_to(REPO)}:{n}: {line.strip()}" for f in _files()
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_a_page_leads_to_a_file_in_the_repository(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO) and path.exists(), f"{page.relative_to(REPO)} links to {target}"


def _options_in_table_row(text: str, row_start: str) -> set[str]:
    row = next(line for line in text.splitlines() if line.startswith(row_start))
    return set(re.findall(r"`([\w.]+)`", row))


@pytest.mark.parametrize("page,row_of", [
    (README, {"parallel": "| strategies", "zero": "| sharding", "precision": "| precision", "model": "| models",
              "data": "| data", "activation_checkpointing": "| activation checkpointing"}),
    (DOCS / "concepts" / "config-groups.md", {g: f"| `{g}` |" for g in ("parallel", "zero", "precision", "model",
                                                                        "optimizer", "scheduler", "data",
                                                                        "activation_checkpointing")}),
])
def test_the_supported_tables_list_every_option_of_the_groups(page, row_of):
    text = page.read_text()
    groups = user_groups()
    for group, row_start in row_of.items():
        named = _options_in_table_row(text, row_start)
        missing = set(groups[group]) - named
        assert not missing, f"{page.relative_to(REPO)}: the {group} row lacks {sorted(missing)}"


def test_every_model_option_the_docs_name_exists():
    models = set(user_groups()["model"])
    for page in pages():
        for name in re.findall(r"\bmodel=([a-z0-9_]+)(?![\w*])", page.read_text()):
            assert name in models, f"{page.relative_to(REPO)} names model={name}, which conf/model/ does not have"


def test_the_benchmarks_page_lists_every_benchmark_script():
    text = (DOCS / "benchmarks" / "index.md").read_text()
    for script in sorted((REPO / "benchmarks").glob("*.*")):
        assert f"`{script.name}`" in text, f"docs/benchmarks/index.md does not say what {script.name} measures"


def test_the_h100_page_shows_every_measured_row():
    text = (DOCS / "benchmarks" / "h100.md").read_text()
    for line in (REPO / "tests" / "fixtures" / "h100_single_gpu.jsonl").read_text().splitlines():
        row = json.loads(line)
        shown = next((r for r in text.splitlines() if r.startswith(f"| `{row['name']}` |")), None)
        assert shown is not None, f"{row['name']} is not on docs/benchmarks/h100.md"
        for key in ("peak_allocated_gib", "peak_reserved_gib", "step_s"):
            if row.get(key) is not None:
                assert f"| {row[key]} |" in shown, (row["name"], key)


def test_the_layers_diagram_is_what_the_imports_draw():
    assert layers_diagram.current_block(layers_diagram.PAGE.read_text()) == layers_diagram.block(), \
        "the layers changed: redraw with `python -m tests.tools.layers_diagram`"
