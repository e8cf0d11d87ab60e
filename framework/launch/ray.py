"""launcher.engine=ray: the job as a Ray Train `TorchTrainer` on a Ray cluster.

The cluster is `launcher.ray.address` (host:port of its head, or ray://host:10001 for Ray Client), else
RAY_ADDRESS (what `ray job submit` and a KubeRay RayJob give their entrypoint), else a Ray instance started
here for the job. The workers are the strategy's world (launcher.nproc_per_node, or what its degrees ask),
placed by Ray; each asks for `launcher.ray.resources_per_worker` (Ray's default: one CPU, and one GPU when the
job trains on GPUs). Ray's torch backend forms the process group, and every worker runs the framework's own
worker (framework.launch.ray_worker). `launcher.max_restarts` is Ray's FailureConfig(max_failures): a
failed group is started again and continues from the newest complete checkpoint. Ray's own files for the run
(RunConfig.storage_path) go where the checkpoints go: checkpoint.dir, a path or a bucket.
"""
from __future__ import annotations

import os
import socket
import sys
import uuid

from framework import storage
from framework.checkpoint.names import checkpoint_dir
from framework.errors import ConfigError
from framework.launch.base import Engine
from framework.launch.ray_probe import handshake
from framework.redact import redacted
from framework.runtime.cluster_env import discover
from framework.runtime.devices import process_group_backend
from framework.runtime.faults import FAULTS_ENV
from framework.runtime.world import under_torchrun

#: the driver's environment that the workers get too: the test switch of framework.runtime.faults
FORWARDED_ENV = (FAULTS_ENV,)
#: how long the address check waits for the cluster's head to take the connection, and then to answer
CONNECT_TIMEOUT_S = 10.0


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("launcher.ray.address", f"{address!r} is not host:port (or ray://host:port); "
                                                  f"leave it null to start a Ray instance here")
    return host, int(port)


def _reachable(address: str) -> None:
    """A TCP connection to the head, then a handshake with it (framework.launch.ray_probe), each within
    CONNECT_TIMEOUT_S, so a wrong address fails in seconds: Ray's own driver retries without end where something
    else listens."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except socket.gaierror:
        raise ConfigError("launcher.ray.address", f"{address}: no such host") from None
    except OSError as e:
        raise ConfigError("launcher.ray.address", f"{address}: no Ray cluster answers there "
                                                  f"({e.strerror or type(e).__name__})") from None
    why = handshake(host, port, client=address.startswith("ray://"), timeout_s=CONNECT_TIMEOUT_S)
    if why is not None:
        raise ConfigError("launcher.ray.address", f"{address}: no Ray cluster answers there ({why})")


class RayEngine(Engine):
    def check(self) -> None:
        if under_torchrun() or discover(os.environ) is not None:
            raise ConfigError("launcher.engine", "launcher.engine=ray starts its own workers, but this process is "
                                                 "already one worker of torchrun, a SLURM step or a Kubeflow job; "
                                                 "run it once, on one node, or use launcher.engine=torch")
        try:
            import ray  # noqa: F401
            from ray.train.torch import TorchTrainer  # noqa: F401
        except ImportError:
            raise ConfigError("launcher.engine", "launcher.engine=ray needs Ray Train: "
                                                 "pip install 'framework[ray]'") from None
        self.address = self.cfg.launcher.ray.address or os.environ.get("RAY_ADDRESS") or None
        if self.address not in (None, "auto", "local"):
            _reachable(self.address)
        self._connect()
        self.use_gpu = self.cfg.device == "cuda" or (self.cfg.device == "auto" and self._cluster_gpus() > 0)
        if self.use_gpu and self._cluster_gpus() < self.world_size:
            raise ConfigError("launcher.nproc_per_node", f"{self.world_size} Ray workers of one GPU each, but the "
                                                         f"cluster has {self._cluster_gpus():g} GPUs")
        for path in self.cfg.launcher.ray.callbacks:
            _callback(path)

    def _connect(self) -> None:
        import ray
        try:
            # "local": a Ray instance of this job's own (ray.init's default would join any on this machine)
            ray.init(address=self.address or "local", log_to_driver=True, logging_level="WARNING",
                     ignore_reinit_error=True)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ConfigError("launcher.ray.address", f"{self.address or 'a local Ray instance'}: "
                                                      f"{(str(e).strip().splitlines() or [type(e).__name__])[-1]}") \
                from None
        self.started_here = self.address in (None, "local")

    def _cluster_gpus(self) -> float:
        import ray
        return ray.cluster_resources().get("GPU", 0)

    def run(self, run_dir: str) -> None:
        import ray
        from omegaconf import OmegaConf
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        from framework.launch.ray_worker import train_loop
        cfg = self.cfg
        import torch
        backend = process_group_backend(cfg, torch.device("cuda" if self.use_gpu else "cpu"))
        run_dir = os.path.abspath(run_dir)
        root = checkpoint_dir(cfg, run_dir)
        storage_path, filesystem = _ray_storage(root if storage.is_url(root) else os.path.abspath(root))
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"config": OmegaConf.to_yaml(cfg, resolve=True), "run_dir": run_dir,
                               "run_id": uuid.uuid4().hex[:12], "cwd": os.getcwd(),
                               "env": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}},
            torch_config=TorchConfig(backend=backend, timeout_s=int(cfg.launcher.timeout_s)),
            scaling_config=ScalingConfig(num_workers=self.world_size, use_gpu=self.use_gpu,
                                         resources_per_worker=dict(cfg.launcher.ray.resources_per_worker) or None),
            run_config=RunConfig(name=f"ray-{os.path.basename(run_dir)}-{uuid.uuid4().hex[:6]}",
                                 storage_path=storage_path, storage_filesystem=filesystem,
                                 failure_config=FailureConfig(max_failures=cfg.launcher.max_restarts),
                                 callbacks=[_callback(path)() for path in cfg.launcher.ray.callbacks]))
        try:
            trainer.fit()
        except ray.train.TrainingFailedError as e:
            attempts = cfg.launcher.max_restarts + 1
            print(f"error: the Ray workers failed ({attempts} attempt{'s' if attempts > 1 else ''}, "
                  f"launcher.max_restarts={cfg.launcher.max_restarts}): {redacted(_first_cause(e))}", file=sys.stderr)
            sys.exit(1)
        finally:
            if self.started_here:
                ray.shutdown()


def _ray_storage(root: str):
    """(RunConfig.storage_path, storage_filesystem): the checkpoints' own place; a URL through the same fsspec
    file system (endpoint, credentials) the checkpoints use, wrapped for Ray's pyarrow."""
    if not storage.is_url(root):
        return root, None
    import pyarrow.fs
    from fsspec.core import url_to_fs
    fs, path = url_to_fs(root)
    return path, pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))


def _callback(path: str):
    import importlib
    from ray.train import UserCallback
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError("launcher.ray.callbacks", f"cannot import {path!r} ({type(e).__name__})") from None
    if not (isinstance(cls, type) and issubclass(cls, UserCallback)):
        raise ConfigError("launcher.ray.callbacks", f"{path} is not a ray.train.UserCallback class")
    return cls


def _first_cause(error: BaseException) -> str:
    """The first worker's error in one line (Ray's message holds every worker's traceback)."""
    text = str(error).strip().splitlines()
    lines = [line.strip() for line in text if line.strip() and not line.startswith((" ", "Traceback", "File "))]
    return lines[-1] if lines else type(error).__name__
