"""No import circles between the modules that used to form them (launch <-> worker,
deepspeed strategy <-> its config), lazy imports inside functions included."""
import ast

import pytest

from tests.harness.helpers import REPO


def _imports(module: str) -> set[str]:
    tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("a,b", [("framework.launch.admission", "framework.train.worker"),
                                 ("framework.strategies.deepspeed.strategy", "framework.strategies.deepspeed.config")])
def test_no_circle(a, b):
    assert not (b in _imports(a) and a in _imports(b)), f"{a} and {b} import each other"
    assert a not in _imports(b), f"{b} imports {a}"
