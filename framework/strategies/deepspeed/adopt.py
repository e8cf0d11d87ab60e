"""A user's DeepSpeed JSON (parallel.ds_config) sets the run where the user left our default.

Rule: what the user chose explicitly (command line or recipe) is the truth; a value fixed in the file
replaces one the user left at our default (zero stage, offload devices, fp16/bf16, gradient clipping,
batch sizes, optimizer and warm-up numbers); "auto" is filled from the run later, by config.py.
A fixed value that contradicts an explicit choice, or that this machine cannot run, is refused in one
line naming both sides. Runs in the launching process, before validation, so the resolved config in
the run dir shows what ran.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from framework.config.explicit import is_explicit
from framework.errors import ConfigError
from framework.parallel.batch_layout import micro_batch_for
from framework.parallel.precision import COMPUTE_DTYPES
from framework.strategies.deepspeed.config import has_fp16_hardware, load_user_config
from framework.strategies.deepspeed.values import AUTO, MISSING, lookup, same

if TYPE_CHECKING:
    from framework.config.schema import Config

_enabled = lambda device: device != "none"   # noqa: E731

# (path in the file, run key, does choosing the key's group count as choosing it, file value -> run value)
ADOPTED = (
    (("zero_optimization", "stage"), "zero.stage", True, int),
    (("zero_optimization", "offload_optimizer", "device"), "zero.offload_optimizer", False, _enabled),
    (("zero_optimization", "offload_param", "device"), "zero.offload_params", False, _enabled),
    (("gradient_clipping",), "trainer.grad_clip", False, float),
    (("train_batch_size",), "trainer.global_batch_size", False, int),
    (("train_micro_batch_size_per_gpu",), "trainer.micro_batch_size", False, int),
    (("optimizer", "params", "lr"), "optimizer.lr", False, float),
    (("optimizer", "params", "weight_decay"), "optimizer.weight_decay", False, float),
    (("optimizer", "params", "eps"), "optimizer.eps", False, float),
    (("optimizer", "params", "betas"), "optimizer.betas", False, lambda v: [float(x) for x in v]),
    (("scheduler", "params", "warmup_max_lr"), "optimizer.lr", False, float),
    (("scheduler", "params", "warmup_num_steps"), "scheduler.warmup_steps", False, int),
)


def _set_precision(cfg: Config, name: str) -> None:
    """Switch the precision group to another option, as `precision=<name>` would: its options differ from
    the schema only in the name and the compute dtype; the rest of precision.* stays as composed."""
    cfg.precision.name = name
    cfg.precision.param_dtype = COMPUTE_DTYPES[name]


def adopt(cfg: Config, world_size: int, explicit: set[str]) -> None:
    path = cfg.parallel.ds_config
    if not path:
        return
    user = load_user_config(path)
    problems = []

    def take(key: str, value, group_picks_it: bool, shown: str) -> None:
        current = OmegaConf.select(cfg, key)
        if same(OmegaConf.to_container(current) if OmegaConf.is_config(current) else current, value):
            return
        if is_explicit(key, explicit, group_picks_it):
            now = OmegaConf.to_container(current) if OmegaConf.is_config(current) else current
            problems.append(f"{shown} contradicts {key}={json.dumps(now)} chosen on the command line or recipe")
        else:
            OmegaConf.update(cfg, key, value, merge=False)

    for ds_path, key, group_picks_it, convert in ADOPTED:
        value = lookup(user, ds_path)
        if value is MISSING or value == AUTO:
            continue
        if ds_path[0] == "optimizer" and OmegaConf.select(cfg, key) is None and key not in cfg.optimizer:
            continue   # the optimizer group has no such parameter: config.py names the mismatch
        take(key, convert(value), group_picks_it, f"{'.'.join(ds_path)}={json.dumps(value)}")

    for precision in ("fp16", "bf16"):
        enabled = lookup(user, (precision, "enabled"))
        if enabled is not True:
            continue
        if precision == "fp16" and not has_fp16_hardware(cfg):
            problems.append("fp16.enabled=true cannot run on this machine: DeepSpeed's CPU accelerator has no fp16; "
                            "set it to \"auto\" in the file, or use precision=bf16 with it set to \"auto\"")
        elif cfg.precision.name != precision:
            if is_explicit("precision.name", explicit, group_picks_it=True):
                problems.append(f"{precision}.enabled=true contradicts precision={cfg.precision.name} "
                                f"chosen on the command line or recipe")
            else:
                _set_precision(cfg, precision)

    # A fixed accumulation with the micro batch left to us: the micro batch that makes it (where one does;
    # otherwise config.py names the contradiction).
    gas = lookup(user, ("gradient_accumulation_steps",))
    if isinstance(gas, int) and not isinstance(gas, bool) and lookup(user, ("train_micro_batch_size_per_gpu",)) \
            in (MISSING, AUTO) and not is_explicit("trainer.micro_batch_size", explicit):
        micro = micro_batch_for(cfg.trainer.global_batch_size, world_size, gas)
        if micro is not None:
            OmegaConf.update(cfg, "trainer.micro_batch_size", micro)

    scheduler = user.get("scheduler")
    if isinstance(scheduler, dict) and is_explicit("scheduler.name", explicit, group_picks_it=True):
        problems.append(f"scheduler ({scheduler.get('type')}) contradicts scheduler={cfg.scheduler.name} chosen on "
                        f"the command line or recipe; delete one of them")
    if problems:
        raise ConfigError("parallel.ds_config", f"{path}: " + "; ".join(problems))
