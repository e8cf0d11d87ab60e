"""The package's layers, lowest first: a module imports only from its own layer or below (lazy imports
inside functions count too), so no arrow points up and a change low in the house never needs one above.
docs/design/layers.md draws the same order from this list and the imports (tests/layers_diagram.py)."""
import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

LAYERS = [
    {"errors", "exit_codes", "faults", "host_memory", "loss", "determinism", "nonfinite", "fork_server_exit",
     "storage", "redact"},
    {"cluster", "data", "models", "optim", "preemption", "elastic", "watchdog"},
    {"checkpoint", "devices"},
    {"world", "sweep_gpus", "precision"},
    {"parallel"},
    {"metrics"},
    {"config", "export", "generate"},
    {"strategies"},
    {"trainer", "step_batches", "config_store"},
    {"plan", "worker"},
    {"launchers"},
    {"launch"},
    {"__main__", "k8s", "reference", "compare", "torchrun"},
]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
PACKAGE = REPO / "framework"


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "framework" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "framework":
                found.update(f"framework.{alias.name}" for alias in node.names)
    return {m for m in found if m.startswith("framework.")}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "conf" not in path.relative_to(PACKAGE).parts:
            yield path, _room("framework." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))


def test_every_room_has_a_layer():
    rooms = {room for _, room in _modules()} - {"__init__"}
    assert rooms <= set(LAYER), f"give these a layer: {sorted(rooms - set(LAYER))}"


@pytest.mark.parametrize("path,room", [m for m in _modules() if m[1] != "__init__"],
                         ids=lambda x: str(x.relative_to(PACKAGE)) if isinstance(x, Path) else "")
def test_no_import_points_up(path, room):
    up = sorted(m for m in _imports(path) if (r := _room(m)) and r != room and LAYER.get(r, -1) > LAYER[room])
    assert not up, f"{path.relative_to(REPO)} (layer {LAYER[room]}) imports higher layers: {up}"


def test_the_errors_module_is_a_leaf():
    assert not _imports(PACKAGE / "errors.py")


def test_config_imports_no_strategy_and_plan_no_launcher_nor_strategy_by_name():
    config = {m for p in (PACKAGE / "config").rglob("*.py") for m in _imports(p)}
    assert not {m for m in config if m.startswith("framework.strategies")}
    plan = {m for p in (PACKAGE / "plan").rglob("*.py") for m in _imports(p)}
    assert not {m for m in plan if m.startswith("framework.launch")}
    assert {m for m in plan if m.startswith("framework.strategies")} <= {"framework.strategies.registry"}
