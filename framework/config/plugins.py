"""Hydra launchers and sweepers that an extra of pyproject.toml installs: a command line choosing one whose
plugin is not installed is refused in one line naming the extra (Hydra's own error lists the options it has,
over several lines, and says nothing of where the missing one comes from)."""
from __future__ import annotations

from framework.errors import MissingExtra, installed

#: (config group, option) -> (the plugin's module, its distribution, the extra that installs it)
PLUGINS = {
    ("hydra/launcher", "joblib"): ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "sweep"),
    ("hydra/sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper", "sweep"),
    # conf/hydra/launcher/{slurm,local}.yaml: the framework's settings for the submitit launcher
    ("hydra/launcher", "slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("hydra/launcher", "local"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("hydra/launcher", "submitit_slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
    ("hydra/launcher", "submitit_local"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "slurm"),
}


def refuse_missing_plugins(overrides: list[str]) -> None:
    for override in overrides:
        group, _, option = override.lstrip("+~").partition("=")
        if (group, option) in PLUGINS:
            module, package, extra = PLUGINS[group, option]
            if not installed(module):
                raise MissingExtra(group, f"{group}={option} is run by", package, extra)
