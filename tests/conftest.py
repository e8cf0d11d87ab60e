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


def pytest_terminal_summary(terminalreporter):
    """What the combination matrix covered and refused (tests/test_matrix.py), when it ran."""
    from tests.matrix import report
    if report.LINES:
        terminalreporter.section("combination matrix")
        for line in report.LINES:
            terminalreporter.write_line(line)
