"""Whether the framework admits a job: its own composition (Hydra, conf/) and its own checks before launch
(framework.launch.admission.admit), asked in this process in milliseconds, never a rule of the matrix's."""
from __future__ import annotations

import copy

import yaml

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.config.paths import CONFIG_DIR
from framework.errors import ConfigError
from framework.launch import admission
from framework.compose.config_store import register_configs
from framework.parallel.mesh import DIMS
from tests.matrix.axes import Axis

#: what every matrix job runs: a few thousand parameters, 3 steps of 8 sequences of 32 tokens (the parity of
#: two updates' losses and of three updates' parameters; a resume from step 2 replays the third step. A fourth
#: step made the whole matrix 16% slower: 307 s against 264 s alone, on 2 cores). The crossed batch ramp grows
#: within these steps, after the resume point (test_matrix.py holds it to that)
BASE = ("data.seq_len=32", "trainer.max_steps=3", "trainer.global_batch_size=8", "trainer.micro_batch_size=2",
        "trainer.log_every=1", "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]",
        "scheduler.warmup_steps=1")
#: the most ranks a matrix job may have (a cost rule of the matrix, not a refusal of the framework's)
MAX_WORLD = 4
#: compiled jobs trace through dynamo and AOTAutograd without generating kernels (a cost rule too: inductor's
#: C++ kernels take ~30 s of CPU a job here). What compiling changes in how options compose - graph breaks,
#: hooks, checkpointing and DTensor inside the graph - is crossed; inductor's numerics are held to parity by
#: tests/integration/parallel/test_compile.py.
CHEAPER = {("trainer.compile", True): ("trainer.compile_backend=aot_eager",)}
#: what a compiled job costs, in ranks of an eager one (dynamo and AOTAutograd trace every stage: 10-30 s)
COMPILED_COST = 4


class Refused(Exception):
    """The framework's one line for a job it refuses (ConfigError), or Hydra's composition error."""


class TooLarge(Exception):
    """Admitted, but more ranks than the matrix runs."""


class Oracle:
    def __init__(self, axes: list[Axis], scratch: str):
        self.axes, self.scratch = axes, scratch
        self.groups = [a for a in axes if a.is_group]
        self.fields = [a for a in axes if not a.is_group]
        self._composed: dict[tuple, object] = {}
        self._verdicts: dict[tuple, str | None] = {}
        self._worlds: dict[tuple, int] = {}
        register_configs()
        OmegaConf.register_new_resolver("fw_run_dir", admission.agree_run_dir, replace=True)
        OmegaConf.register_new_resolver("fw_hydra_subdir", admission.hydra_output_subdir, replace=True)
        self._hydra = initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None)
        self._hydra.__enter__()

    def close(self) -> None:
        """Leave Hydra's global context, so that whatever runs next in this process can compose its own."""
        self._hydra.__exit__(None, None, None)

    def group_overrides(self, job: dict) -> list[str]:
        """BASE and the groups (always chosen: a job without a group value gets the group's default)."""
        out = list(BASE)
        for axis in self.groups:
            out += axis.overrides(job.get(axis.key, axis.values[0]), self.scratch)
        return out

    def overrides(self, job: dict) -> list[str]:
        """The command line of `job` (axis key -> value; a field axis the job leaves out is not set)."""
        out = self.group_overrides(job)
        for axis in self.fields:
            if axis.key in job:
                out += axis.overrides(job[axis.key], self.scratch)
                out += CHEAPER.get((axis.key, job[axis.key]), ())
        return out

    def _compose(self, overrides: tuple):
        if overrides not in self._composed:
            self._composed[overrides] = compose(config_name="config", overrides=list(overrides))
        return self._composed[overrides]

    def verdict(self, job: dict) -> str | None:
        """None if the framework admits `job` (within MAX_WORLD ranks), else the reason, one line."""
        key = _key(job)
        if key not in self._verdicts:
            self._verdicts[key] = self._judge(job)
        return self._verdicts[key]

    def config(self, job: dict):
        """The config `job` composes to (Hydra's errors raised)."""
        groups = self.group_overrides(job)
        cfg = copy.deepcopy(self._compose(tuple(groups)))
        for override in self.overrides(job)[len(groups):]:   # as Hydra applies a command-line override
            key, _, value = override.partition("=")
            OmegaConf.update(cfg, key, yaml_value(value), merge=True)
        return cfg

    def composed(self, job: dict) -> str:
        """The config `job` composes to, as text: jobs that set a value to its default give the same text."""
        return OmegaConf.to_yaml(self.config(job))

    def world(self, job: dict) -> int:
        """The ranks an admitted job runs."""
        assert self.verdict(job) is None, job
        return self._worlds[_key(job)]

    def cost(self, job: dict) -> int:
        """What running an admitted job costs, roughly: its ranks, a compiled one COMPILED_COST times more."""
        return self.world(job) * (COMPILED_COST if job.get("trainer.compile") else 1)

    def _judge(self, job: dict) -> str | None:
        groups = self.group_overrides(job)
        fields = self.overrides(job)[len(groups):]
        try:
            cfg = self.config(job)
        except (HydraException, OmegaConfBaseException) as e:
            return "hydra: " + " ".join(str(e).split())
        try:
            _, world, _ = admission.admit(cfg, explicit={o.split("=")[0] for o in groups[len(BASE):] + fields})
        except ConfigError as e:
            return f"error: {e}"
        if world <= MAX_WORLD:
            self._worlds[_key(job)] = world
            return None
        degrees = " x ".join(f"parallel.{d}" for d in DIMS)
        return f"too large: {world} ranks ({degrees}); the matrix runs at most {MAX_WORLD}"


def _key(job: dict) -> tuple:
    return tuple(sorted(job.items()))


def yaml_value(text: str):
    """An override's value as Hydra's parser reads it (a number, a bool, null, a list, else the string)."""
    return yaml.safe_load(text)
