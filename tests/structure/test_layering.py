"""The package's layers, lowest first, read from its folders: each folder of framework/ is a room, and a module
imports only from its own room or a lower layer (lazy imports inside functions count too), so no arrow points up
and a change low in the house never needs one above. A module at the package's root is a leaf (it imports only
other leaves, and anything may import it) or a front door (a command: nothing imports it); so is a folder's
__main__.py (`python -m framework.plan`). docs/design/layers.md draws the same order from this list and the imports
(tests/tools/layers_diagram.py)."""
import ast
from pathlib import Path

import pytest

from tests.harness.helpers import REPO

PACKAGE = REPO / "framework"
#: the root's leaves: imported from anywhere, importing only each other
LEAVES = {"errors", "exit_codes", "redact"}
#: the folders, lowest layer first
FOLDERS = [
    {"storage"},
    {"runtime", "models", "optim"},
    {"data", "parallel", "objectives", "evaluation"},
    {"checkpoint"},
    {"metrics"},
    {"config"},
    {"strategies", "export"},
    {"compose"},
    {"train", "plan"},
    {"launch", "k8s"},
]
#: the commands: the root's own and every folder's __main__
FRONT_DOORS = {"__main__", "compare", "eval", "generate", "reference", "torchrun",
               *(f"{p.parent.name}.__main__" for p in PACKAGE.glob("*/__main__.py"))}
LAYERS = [LEAVES, *FOLDERS, FRONT_DOORS]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _room(module: str) -> str | None:
    """The room of a framework module: its folder, its own name at the root, `folder.__main__` for a command."""
    parts = module.split(".")
    if parts[0] != "framework" or len(parts) < 2:
        return None
    if parts[-1] == "__main__" and len(parts) == 3:
        return f"{parts[1]}.__main__"
    return parts[1]


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


def test_every_folder_and_root_module_has_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    listed = set().union(*FOLDERS)
    assert folders == listed, f"folders without a layer: {sorted(folders - listed)}; gone: {sorted(listed - folders)}"
    roots = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert roots <= LEAVES | FRONT_DOORS, f"a root module is a leaf or a front door: {sorted(roots - LEAVES - FRONT_DOORS)}"


@pytest.mark.parametrize("path,room", [m for m in _modules() if m[1] != "__init__"],
                         ids=lambda x: str(x.relative_to(PACKAGE)) if isinstance(x, Path) else "")
def test_no_import_points_up(path, room):
    up = sorted(m for m in _imports(path) if (r := _room(m)) and r != room and LAYER.get(r, -1) > LAYER[room])
    assert not up, f"{path.relative_to(REPO)} (layer {LAYER[room]}) imports higher layers: {up}"


def test_the_leaves_import_only_leaves_and_nothing_imports_a_front_door():
    assert not _imports(PACKAGE / "errors.py")
    for leaf in LEAVES:
        assert {_room(m) for m in _imports(PACKAGE / f"{leaf}.py")} <= LEAVES, leaf
    into_doors = sorted((str(path.relative_to(REPO)), m) for path, _ in _modules() for m in _imports(path)
                        if _room(m) in FRONT_DOORS)
    assert not into_doors


def test_config_imports_no_strategy_and_plan_no_launcher_nor_strategy_by_name():
    config = {m for p in (PACKAGE / "config").rglob("*.py") for m in _imports(p)}
    assert not {m for m in config if m.startswith("framework.strategies")}
    plan = {m for p in (PACKAGE / "plan").rglob("*.py") if p.stem != "__main__" for m in _imports(p)}
    assert not {m for m in plan if m.startswith("framework.launch")}
    assert {m for m in plan if m.startswith("framework.strategies")} <= {"framework.strategies.registry"}
