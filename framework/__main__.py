"""`python -m framework [overrides]`: the Hydra app and nothing else."""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from framework import launch
from framework.config.store import register_configs

_task_started = False


@hydra.main(version_base=None, config_path="conf", config_name="config")
def app(cfg) -> None:
    global _task_started
    _task_started = True
    launch.run(cfg, HydraConfig.get().runtime.output_dir)


def main() -> None:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        from framework.config.help import help_text
        print(help_text())
        return
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", launch.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", launch.hydra_output_subdir, replace=True)
    try:
        app()
    except SystemExit as e:
        # Hydra exits 1 when it cannot compose the config: that is a usage error, so 2.
        if e.code == 1 and not _task_started:
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
