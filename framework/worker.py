"""One training process: build the strategy, train, tear down."""
from __future__ import annotations

from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from framework.strategies.registry import strategy_class
from framework.trainer import Trainer


def run_worker(cfg, run_dir: str) -> None:
    strategy = strategy_class(cfg.parallel.name)(cfg)
    strategy.setup_distributed()
    Trainer(cfg, strategy, run_dir).fit()
    # Only after success: teardown synchronises all ranks, and a rank that raised must exit at once
    # (its peers may be blocked in a collective) so the elastic agent sees the failure and stops the group.
    strategy.teardown()


@record
def worker_entry(run_dir: str, config_file: str) -> None:
    """Entry point of a spawned worker: the resolved config the parent validated and saved."""
    run_worker(OmegaConf.load(config_file), run_dir)
