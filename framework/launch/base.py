"""What an engine does for framework.launch.admission: refuse what it cannot run before any work, start what can overlap
the rest of the launch, then run the workers on the validated, resolved config."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framework.config.schema import Config


class Engine(ABC):
    def __init__(self, cfg: Config, strategy_cls, world_size: int):
        self.cfg, self.strategy_cls, self.world_size = cfg, strategy_cls, world_size

    def check(self) -> None:
        """Before validation: raise ConfigError for what this engine cannot run here."""

    def prepare(self) -> None:
        """After validation, before the run dir is written: start what overlaps the rest of the launch."""

    @abstractmethod
    def run(self, run_dir: str) -> None:
        """Run the job's workers to the end; exit non-zero (sys.exit) when they fail."""
