"""launcher.engine -> what runs the workers: `torch` (spawned here through torch's elastic launcher, or this
process is one of torchrun's, a SLURM step's or a Kubeflow pod's) or `ray` (a Ray Train TorchTrainer on a Ray
cluster). Adding an engine: one module under framework/launch/ and one line here. Class paths are strings,
imported only when the engine is chosen, so an engine's library is needed only by the jobs that use it."""
from __future__ import annotations

import importlib
from typing import NamedTuple

from framework.errors import ConfigError


class EngineEntry(NamedTuple):
    path: str               # module:class of its framework.launch.base.Engine
    workers_here: bool      # its workers run on this host, so this host's GPUs must hold them


ENGINES: dict[str, EngineEntry] = {
    "torch": EngineEntry("framework.launch.torch:TorchEngine", workers_here=True),
    "ray": EngineEntry("framework.launch.ray:RayEngine", workers_here=False),
}


def register(name: str, path: str, workers_here: bool) -> None:
    """Another engine under `name` (a plugin or a test): `path` is "module:class" of its Engine."""
    ENGINES[name] = EngineEntry(path, workers_here)


def engine_class(name: str):
    if name not in ENGINES:
        raise ConfigError("launcher.engine", f"unknown engine {name!r}; available: {', '.join(ENGINES)}")
    module, cls = ENGINES[name].path.split(":")
    return getattr(importlib.import_module(module), cls)


def workers_here(cfg) -> bool:
    return ENGINES[cfg.launcher.engine].workers_here
