"""`python -m framework [overrides]`: the Hydra app and nothing else."""
import atexit
import os
import sys

_EXIT_CODE: list = [None]     # this run's exit status, once main() has ended (set by run_as_command only)


def _exit_without_teardown() -> None:
    """Python's normal exit, less the teardown of the modules: with torch loaded that takes ~1 s after the run is
    over (a refused config: ~0.8 s of CPU less, docs/benchmarks/cpu.md). Registered before anything
    else can register an exit handler, it runs last of them (atexit's order is the reverse of registration), after
    the interpreter has joined its threads and every other handler ran (logging, multiprocessing, Hydra); files
    the run opened it closed itself (the trainer's finally). An uncaught exception other than SystemExit leaves
    the exit to Python (its traceback printed, its own status)."""
    code = _EXIT_CODE[0]
    if code is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


atexit.register(_exit_without_teardown)

import hydra  # noqa: E402 (imported after the handler above is registered)
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from framework import exit_codes
from framework.compose.config_store import register_configs
from framework.config.paths import CONFIG_DIR
from framework.config.plugins import refuse_missing_plugins
from framework.config.removed import refuse_removed_keys
from framework.config.schema import Config
from framework.errors import ConfigError
from framework.launch import admission, sweep_gpus
from framework.redact import RedactingStream, redact_files, redacted

_task_started = False
_failed_points: set[int] = set()


class SweepPointFailed(RuntimeError):
    """A sweep point that exited non-zero: the sweeper records it (Optuna: a failed trial) and goes on."""


@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="config")
def app(cfg: Config) -> float | None:
    """Returns the run's trainer.objective, which a sweeper such as Optuna minimises."""
    global _task_started
    _task_started = True
    redact_hydra_records()
    refuse_a_study_without_its_objective(cfg)
    try:
        return admission.run(cfg, HydraConfig.get().runtime.output_dir)
    except SystemExit as e:
        # sys.exit would end the whole sweep; an exception ends only this point.
        if HydraConfig.get().mode != RunMode.MULTIRUN or e.code not in (exit_codes.USAGE, 1):
            raise
        _failed_points.add(e.code)
        raise SweepPointFailed(f"exit code {e.code}") from None


def redact_hydra_records() -> None:
    """Hydra writes the command line's values into its records before the job starts (.hydra/ in the run dir,
    multirun.yaml in a sweep's dir): rewrite them with credentials redacted, first thing."""
    hydra_cfg = HydraConfig.get()
    paths = []
    if hydra_cfg.output_subdir is not None:
        records = os.path.join(hydra_cfg.runtime.output_dir, hydra_cfg.output_subdir)
        paths += [os.path.join(records, name) for name in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if hydra_cfg.mode == RunMode.MULTIRUN:
        paths.append(os.path.join(hydra_cfg.sweep.dir, "multirun.yaml"))
    redact_files(paths)


def refuse_a_study_without_its_objective(cfg: Config) -> None:
    """An Optuna study minimises trainer.objective; val_loss with evaluation off is never logged, and every
    trial would run before the sweeper found no value. Refused before the first trial, ending the whole
    sweep (a SystemExit is not a failed trial)."""
    sweeper = HydraConfig.get().sweeper.get("_target_", "")
    t = cfg.trainer
    if HydraConfig.get().mode == RunMode.MULTIRUN and "optuna" in sweeper and t.objective == "val_loss" \
            and not t.eval_every:
        print("error: trainer.eval_every: an Optuna study minimises trainer.objective=val_loss, which "
              "trainer.eval_every=0 never computes; set trainer.eval_every to a positive step count, or "
              "trainer.objective=loss to minimise the final training loss", file=sys.stderr)
        admission.remove_if_only_hydra_files(HydraConfig.get().runtime.output_dir)
        sys.exit(exit_codes.USAGE)


def main() -> None:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        from framework.config.help import help_text
        print(help_text())
        return
    try:
        refuse_removed_keys(sys.argv[1:])
        refuse_missing_plugins(sys.argv[1:])
    except ConfigError as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        sys.exit(exit_codes.USAGE)
    if {"-m", "--multirun"} & set(sys.argv[1:]):
        import torch
        sweep_gpus.remember_node_gpus(os.environ, torch.cuda.device_count())
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", admission.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", admission.hydra_output_subdir, replace=True)
    sys.stderr = RedactingStream(sys.stderr)
    try:
        app()
    except SystemExit as e:
        # Hydra exits 1 when it cannot compose the config, or when a sweep's points failed and all of them
        # on their config: those are usage errors, so 2.
        if e.code == 1 and (not _task_started or _failed_points == {exit_codes.USAGE}):
            sys.exit(exit_codes.USAGE)
        raise


def _status(code) -> int:
    """The exit status Python gives SystemExit(code) (it prints a code that is not a number itself)."""
    return 0 if code is None else code if isinstance(code, int) else 1


def run_as_command(entry=None) -> None:
    """Runs `entry` (main) as this process's command: its exit status is kept for _exit_without_teardown."""
    try:
        (entry or main)()
    except SystemExit as e:
        _EXIT_CODE[0] = _status(e.code)
        raise
    _EXIT_CODE[0] = 0


if __name__ == "__main__":
    run_as_command()
