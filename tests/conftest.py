import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework import launch
from framework.config.paths import CONFIG_DIR
from framework.config_store import register_configs
from tests.helpers import FAST, check_ok, losses, run_framework

_references: dict[tuple, list[float]] = {}
_trained: dict[tuple, object] = {}

#: what trained_run adds to FAST: checkpoints at steps 4 and 8
CHECKPOINTED = ("checkpoint.enabled=true", "checkpoint.interval=4")


@pytest.fixture(scope="session")
def single_reference(tmp_path_factory, trained_run):
    """Losses of parallel=single on FAST plus extra args, computed once per distinct args. With none, the
    checkpointed run trained_run("parallel=single") serves (saving changes no loss; one job fewer)."""
    def get(*extra: str) -> list[float]:
        key = tuple(extra)
        if not key:
            return losses(trained_run("parallel=single"))
        if key not in _references:
            run_dir = tmp_path_factory.mktemp("single")
            check_ok(run_framework([*FAST, "parallel=single", *extra], run_dir))
            _references[key] = losses(run_dir)
        return _references[key]
    return get


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """Run dir of an uninterrupted FAST run of a layout with checkpoints at steps 4 and 8, trained once
    per session for every test that reads it (resume, resharding, export). Tests must not write into it."""
    def get(*layout: str):
        key = tuple(layout)
        if key not in _trained:
            run_dir = tmp_path_factory.mktemp("trained")
            check_ok(run_framework([*FAST, *CHECKPOINTED, *layout], run_dir))
            _trained[key] = run_dir
        return _trained[key]
    return get


@pytest.fixture(scope="module")
def compose_config():
    """Compose conf/ in-process exactly as `python -m framework OVERRIDES` would (no run, no workers)."""
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", launch.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", launch.hydra_output_subdir, replace=True)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield lambda overrides: compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on a free local port with a sqlite store, started once per session (it takes a
    few seconds); its tracking URI."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    root = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
                time.sleep(0.2)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # a test server: nothing of it is kept
        proc.wait()
        log.close()
