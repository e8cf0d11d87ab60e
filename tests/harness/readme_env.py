"""The environment README's set-up builds, emulated inside the test environment.

README installs `pip install -e . -c .ci/constraints.txt`: the framework's own dependencies and no extra. The
tests run where every extra is installed (`.[dev]`), so a command that needs an extra works there and fails
for a user who followed README. Building a virtual environment per test is too slow; instead `environment()`
gives a job an environment in which every installed distribution outside the base install's dependency
closure is absent (tests/fixtures/readme_env/sitecustomize.py hides its modules and its metadata), except the
closures of the extras named (what a page tells its reader to install: `pip install 'framework[hf]'`).

The closure is read from the installed metadata (importlib.metadata): the framework's Requires-Dist without
an extra marker, then each requirement's own, recursively, with the extras each asks for (`ray[train]`). A
fresh virtual environment's pip and setuptools stay, as the test checkout's own packages (framework, tests).
"""
from __future__ import annotations

import atexit
import functools
import importlib.metadata as metadata
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

from tests.harness.helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "readme_env"
NOT_INSTALLED = "FRAMEWORK_TEST_NOT_INSTALLED"      # read by the fixture's sitecustomize
#: what `python3 -m venv` puts in a fresh environment before README's pip install
FRESH_VENV = ("pip", "setuptools")
#: our own modules, never hidden (a distribution that ships a top-level `tests` must not hide ours)
OURS = ("framework", "tests")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(dist: str, extras: frozenset) -> list[Requirement]:
    try:
        found = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:       # a dependency this platform or this install does not have
        return []
    out = []
    for line in found:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


@functools.cache
def closure(extras: frozenset = frozenset()) -> frozenset:
    """Canonical names of the installed distributions `pip install -e ".[EXTRAS]"` installs."""
    wanted: dict[str, frozenset] = {}
    todo = [("framework", frozenset(extras))]
    while todo:
        name, asked = todo.pop()
        key = canonical(name)
        if key in wanted and asked <= wanted[key]:
            continue
        wanted[key] = wanted.get(key, frozenset()) | asked
        todo += [(req.name, frozenset(req.extras)) for req in _requirements(name, wanted[key])]
    installed = {canonical(d.metadata["Name"]) for d in metadata.distributions()}
    return frozenset(k for k in wanted if k in installed) | frozenset(map(canonical, FRESH_VENV))


def _modules_of(dist) -> set[str]:
    """Top-level modules of a distribution, and the second level of a namespace it shares (`google.auth`)."""
    out = set()
    for path in dist.files or ():
        parts = Path(path).parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or parts[0] in ("..", "__pycache__"):
            continue
        if len(parts) == 1:
            if parts[0].endswith(".py"):
                out.add(parts[0][:-3])
            elif parts[0].endswith((".so", ".pyd")):
                out.add(parts[0].split(".")[0])
        else:
            out.add(parts[0])
            if len(parts) > 2 or parts[1].endswith(".py"):
                out.add(f"{parts[0]}.{parts[1].split('.')[0] if parts[1].endswith('.py') else parts[1]}")
    return {m for m in out if m.replace(".", "").replace("_", "").isalnum()}


@functools.cache
def not_installed(extras: frozenset = frozenset()) -> tuple[frozenset, frozenset]:
    """(modules, distributions) README's set-up plus `extras` does not install: a top-level module goes when no
    kept distribution ships it; in a namespace some kept one shares (google), its own sub-packages go."""
    kept = closure(extras)
    kept_modules, other_modules, dists = set(), set(), set()
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        modules = _modules_of(dist)
        if name in kept:
            kept_modules |= modules
        else:
            other_modules |= modules
            dists.add(name)
    stdlib = set(sys.stdlib_module_names)
    kept_tops = {m for m in kept_modules if "." not in m}
    blocked = {m for m in other_modules - kept_modules
               if m.split(".")[0] not in stdlib and m.split(".")[0] not in OURS
               and ("." not in m or m.split(".")[0] in kept_tops)
               and ("." in m or m not in kept_tops)}
    return frozenset(blocked), frozenset(dists - kept)


@functools.cache
def _folder() -> Path:
    """This process's folder for the lists (removed when it exits: its jobs have ended by then)."""
    folder = Path(tempfile.mkdtemp(prefix="readme-env-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@functools.cache
def _list_file(extras: frozenset) -> str:
    modules, dists = not_installed(extras)
    folder = _folder()
    path = folder / f"not-installed-{'-'.join(sorted(extras)) or 'base'}.txt"
    path.write_text("".join(f"module {m}\n" for m in sorted(modules)) + "".join(f"dist {d}\n" for d in sorted(dists)))
    return str(path)


def environment(extras=(), base: dict | None = None) -> dict:
    """Environment variables that make a job see README's install plus `extras` (names of pyproject's extras).
    The job server the tests fork jobs from starts with every extra hidden; a job lifts its own."""
    from tests.harness.job_client import SERVER_START
    base = os.environ if base is None else base
    path = os.pathsep.join(p for p in (str(FIXTURE), base.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, NOT_INSTALLED: _list_file(frozenset(extras)),
            SERVER_START: json.dumps({NOT_INSTALLED: _list_file(frozenset())})}
