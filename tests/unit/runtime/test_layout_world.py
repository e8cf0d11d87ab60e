"""A 3d layout on too few devices says what it needs, what the node has, and how to shrink it."""
import pytest
import torch

from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.launch import admission
from framework.runtime import world
from framework.strategies.registry import strategy_class
from tests.unit.runtime.test_cluster_gpus import eight_gpus  # noqa: F401  (the fixture clears launcher variables)


def _validate(cfg):
    cls = strategy_class(cfg.parallel.name)
    derive_and_validate(cfg, world.world_size_for(cfg, cls), cls, explicit=set())


def test_3d_on_a_one_gpu_machine(compose_config, eight_gpus):  # noqa: F811
    eight_gpus.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = compose_config(["parallel=3d", "zero=stage3", "model=tiny", "data.seq_len=32"])
    with pytest.raises(ConfigError) as e:
        _validate(cfg)
    text = f"{e.value}"
    assert e.value.key == "parallel"
    assert "parallel.tp x parallel.pp = 2 x 2 = 4 GPUs" in text and "this node has 1 visible GPU;" in text
    assert "parallel.tp=1 parallel.pp=1" in text


def test_3d_on_too_few_cpu_workers(compose_config):
    cfg = compose_config(["parallel=3d", "model=tiny", "data.seq_len=32", "launcher.nproc_per_node=2", "device=cpu"])
    with pytest.raises(ConfigError, match=r"needs at least .* = 4 workers, but the world size is 2"):
        _validate(cfg)
