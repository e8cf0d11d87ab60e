"""Each default is said once: no dataclass in framework/ declares a field twice (the later
declaration silently wins, so two defaults or two comments can drift apart unnoticed)."""
from __future__ import annotations

import ast
from pathlib import Path

import framework

ROOT = Path(framework.__file__).parent


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def duplicate_fields(source: str) -> list[str]:
    """'Class.field' for every annotated field a dataclass in `source` declares more than once."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and _is_dataclass(node):
            seen = set()
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    name = stmt.target.id
                    if name in seen:
                        found.append(f"{node.name}.{name}")
                    seen.add(name)
    return found


def test_the_scan_finds_a_field_declared_twice():
    src = "from dataclasses import dataclass\n@dataclass\nclass C:\n    a: int = 1\n    b: int = 2\n    a: int = 3\n"
    assert duplicate_fields(src) == ["C.a"]
    assert duplicate_fields(src.replace("@dataclass\n", "")) == []


def test_no_dataclass_in_framework_declares_a_field_twice():
    dups = {str(p.relative_to(ROOT)): d for p in sorted(ROOT.rglob("*.py"))
            if (d := duplicate_fields(p.read_text()))}
    assert dups == {}
