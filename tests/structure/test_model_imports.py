"""Generic code names no model: the trainer, strategies, checkpointing and export reach a model only
through its spec (framework.models.spec), never by importing a model family's package."""
import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.harness.helpers import REPO

GENERIC = ["framework/train/trainer.py", "framework/strategies", "framework/checkpoint", "framework/export"]
FAMILIES = ("framework.models.llama",)


def _sources():
    for entry in GENERIC:
        path = REPO / entry
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path])


def _imported_modules(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_import_statement_names_a_model_family():
    found = [(str(p.relative_to(REPO)), m) for p in _sources() for m in _imported_modules(p)
             if m.startswith(FAMILIES)]
    assert list(_sources()) and not found, found


def test_importing_generic_code_loads_no_model_family():
    modules = [str(p.relative_to(REPO).with_suffix("")).replace("/", ".").removesuffix(".__init__")
               for p in _sources() if p.name != "__main__.py"]
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('framework.'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "framework.train.trainer" in loaded and "framework.strategies.parallel3d" in loaded
    assert not [m for m in loaded if m.startswith(FAMILIES)], loaded
