"""The planner on a GPU machine, checked on CPU with the CUDA boundary stubbed (tests/fixtures/fake_gpus)."""
import pytest
from omegaconf import OmegaConf

from framework import launch, precision
from framework.config.validate import validate
from framework.strategies.registry import strategy_class
from tests.fixtures import fake_gpus
from tests.helpers import FAST, check_ok, read_metrics, run_framework

TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@pytest.fixture
def one_gpu(monkeypatch):
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    precision.compute_supported.cache_clear()
    fake_gpus.install(1, setattr=monkeypatch.setattr)
    yield
    precision.compute_supported.cache_clear()


def test_auto_on_one_gpu_rewrites_the_config_to_a_named_strategy(compose_config, one_gpu):
    # On a GPU machine the world is the visible GPUs (here 1), so `single` is a candidate: its options
    # schema leaves parallel.name MISSING, which ended the launch in 'Missing mandatory value: parallel.name'
    cfg = compose_config([*FAST, "parallel=auto", "device=cuda"])
    launch.choose_auto_layout(cfg)
    assert cfg.parallel.name == "single"
    validate(cfg, 1, strategy_class(cfg.parallel.name))


def test_auto_starts_and_trains_with_a_gpu_detected(tmp_path):
    run_dir = tmp_path / "auto"
    proc = run_framework([*FAST, "trainer.max_steps=2", "parallel=auto", "device=cpu", "launcher.nproc_per_node=1"],
                         run_dir, timeout=180, module="tests.fixtures.fake_gpus", env={"FAKE_GPUS": "1"})
    check_ok(proc)
    assert "parallel=auto:" in proc.stderr and "picked #1" in proc.stderr
    assert OmegaConf.load(run_dir / "config.yaml").parallel.name == "single"
    assert [r["step"] for r in read_metrics(run_dir) if "loss" in r][-1] == 2
