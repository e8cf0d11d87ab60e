"""The journey of a job's config through the framework, as one process lives it (loaded by tests/tools/journey/
sitecustomize.py; tests/tools/import_graph.py reads what it writes).

Tracing starts where a process first gets the job's config: the launcher's entry (ENTRIES: the admission of
`python -m framework`), or a worker's (the config it rebuilt from the launcher's YAML). From there every Python call
into the framework that receives the config object, or one of its nodes, as an argument moves the config into the
callee's module; its return moves it back to the caller's. The journey is the sequence of modules holding the config
(consecutive repeats collapsed) until the trainer's module first gets it (END), where tracing stops."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

#: module -> the function through which the job's config enters a process (the launcher's first, then a worker's)
ENTRIES = {"framework.launch.admission": "run", "framework.train.worker": "run_worker"}
#: the module where the journey ends: the worker's trainer
END = "framework.train.trainer"
PACKAGE = "framework"

_state: dict = {"active": False}


def _root(node):
    """The config a node belongs to. omegaconf has no public way up the tree: test-side, its parent link serves."""
    while (parent := node._get_parent()) is not None:
        node = parent
    return node


def _holds_config(value, config) -> bool:
    from omegaconf import Container
    if isinstance(value, Container):
        return _root(value) is config
    if isinstance(value, (tuple, list)):
        return any(isinstance(v, Container) and _root(v) is config for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, Container) and _root(v) is config for v in value.values())
    return False


def _receives(frame, config) -> bool:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    values = frame.f_locals
    return any(_holds_config(values.get(name), config) for name in code.co_varnames[:n])


def _profile(frame, event, arg):
    state = _state
    if event == "call":
        module = frame.f_globals.get("__name__", "")
        if (module == PACKAGE or module.startswith(PACKAGE + ".")) and _receives(frame, state["config"]):
            state["stack"].append(frame)
            _enter(module, frame.f_code.co_name)
            _note_depth(state["stack"])
            if module == END:
                _finish()
    elif event == "return" and state["stack"] and state["stack"][-1] is frame:
        state["stack"].pop()
        if state["stack"]:
            caller = state["stack"][-1]
            _enter(caller.f_globals["__name__"], None)


def _note_depth(stack) -> None:
    """The deepest hand-on so far: the chain of modules (consecutive repeats collapsed) through which the config
    was passed down to the call now starting."""
    chain = []
    for frame in stack:
        module = frame.f_globals["__name__"]
        if not chain or chain[-1] != module:
            chain.append(module)
    if len(chain) > len(_state["deepest"]):
        _state["deepest"] = chain


def _enter(module: str, function: str | None) -> None:
    path = _state["path"]
    if not path or path[-1] != module:
        path.append(module)
        _state["times"].append(time.monotonic())
    if function is not None:
        _state["calls"].append(f"{module}:{function}")


def _start(config, role: str) -> None:
    _state.update(active=True, config=config, role=role, stack=[], path=[], times=[], calls=[], deepest=[],
                  started=time.monotonic(), done=False)
    sys.setprofile(_profile)


def _finish() -> None:
    if _state.get("done"):
        return
    sys.setprofile(None)
    _state["done"] = True
    out = {"role": _state["role"], "rank": int(os.environ.get("RANK", "0")), "path": _state["path"],
           "times": _state["times"], "started": _state["started"], "calls": _state["calls"], "deepest": _state["deepest"],
           "reached_trainer": _state["path"][-1:] == [END]}
    with open(os.path.join(_state["folder"], f"{_state['role']}-{os.getpid()}.json"), "w") as f:
        json.dump(out, f, indent=1)


def _traced(function, role: str):
    @functools.wraps(function)
    def traced(config, *args, **kwargs):
        if _state["active"]:
            return function(config, *args, **kwargs)
        _start(config, role)
        try:
            return function(config, *args, **kwargs)
        finally:
            _finish()
    return traced


class _WrapEntries(importlib.abc.MetaPathFinder):
    """Wraps each entry function as its module is imported (before anything can take the name)."""

    def find_spec(self, name, path=None, target=None):
        if name not in ENTRIES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_wrap(module):
            exec_module(module)
            role = "launcher" if name == next(iter(ENTRIES)) else "worker"
            setattr(module, ENTRIES[name], _traced(getattr(module, ENTRIES[name]), role))
        spec.loader.exec_module = exec_then_wrap
        return spec


def install(folder: str) -> None:
    _state["folder"] = folder
    sys.meta_path.insert(0, _WrapEntries())
