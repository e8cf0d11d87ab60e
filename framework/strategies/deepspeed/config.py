"""The DeepSpeed JSON of a run, with the run's config groups as the one source of truth.

`resolve(cfg, world_size)` generates the config from trainer.*, precision, zero, optimizer and
parallel.*. A user's file (parallel.ds_config) plus parallel.overrides is then laid on top:
"auto" values are filled from the run, a value that contradicts the run is an error naming
both, and keys the run does not own (profilers, bucket sizes, ...) pass through. Values fixed in
the file have already become the run's where the user left our default (adopt.py).
Nothing here imports deepspeed (on CUDA only its list of prebuilt ops): it runs in the launching
process during validation.
"""
from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.parallel.batch_layout import BatchLayout, batch_layout
from framework.strategies.deepspeed.ops import choose_adam_kernel
from framework.strategies.deepspeed.options import DeepSpeedOptions
from framework.strategies.deepspeed.values import AUTO, MISSING, autos, deep_merge, lookup, put, same

if TYPE_CHECKING:
    from framework.config.schema import Config

# parallel.* knobs copied verbatim into zero_optimization.
ZERO_KNOBS = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
              "allgather_partitions", "allgather_bucket_size", "round_robin_gradients", "sub_group_size",
              "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_gather_16bit_weights_on_model_save")
# parallel.* knobs of the fp16 section that the precision group has no word for.
FP16_KNOBS = ("hysteresis", "min_loss_scale")

# torch optimizer class -> DeepSpeed optimizer type (DeepSpeed's "Adam" is AdamW unless told otherwise).
DS_OPTIMIZERS = {
    "torch.optim.AdamW": ("AdamW", {}),
    "torch.optim.Adam": ("Adam", {"adam_w_mode": False}),
}


def batch(cfg: Config, world_size: int) -> BatchLayout:
    """DeepSpeed data-parallelises over every rank."""
    return batch_layout(cfg, dp=world_size)


def has_fp16_hardware(cfg: Config) -> bool:
    import torch
    return cfg.device != "cpu" and torch.cuda.is_available()


def _knob_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(DeepSpeedOptions)}


def optimizer_section(cfg: Config) -> dict | None:
    """The DeepSpeed "optimizer" section equal to the optimizer group, or None if DeepSpeed has none."""
    opt = cfg.optimizer
    if opt._target_ not in DS_OPTIMIZERS:
        return None
    ds_type, extra = DS_OPTIMIZERS[opt._target_]
    params = {"lr": opt.lr, "weight_decay": opt.get("weight_decay", 0.0)}
    if opt.get("betas") is not None:
        params["betas"] = list(opt.betas)
    if opt.get("eps") is not None:
        params["eps"] = opt.eps
    return {"type": ds_type, "params": {**params, **extra}}


def fp16_scaling(cfg: Config) -> dict:
    """precision.* dynamic loss scaling in DeepSpeed's words (its scale grows x2, backs off x0.5)."""
    prec, p = cfg.precision, cfg.parallel
    return {"loss_scale": 0, "initial_scale_power": int(round(math.log2(prec.init_scale))),
            "loss_scale_window": prec.growth_interval, **{k: p[k] for k in FP16_KNOBS}}


def _offload(cfg: Config, enabled: bool) -> dict:
    p = cfg.parallel
    if not enabled:
        return {"device": "none"}
    if p.nvme_path:
        return {"device": "nvme", "nvme_path": p.nvme_path, "pin_memory": p.pin_memory}
    return {"device": "cpu", "pin_memory": p.pin_memory}


def generate(cfg: Config, world_size: int) -> dict:
    t, p, z, precision = cfg.trainer, cfg.parallel, cfg.zero, cfg.precision.name
    layout = batch(cfg, world_size)
    zero: dict[str, Any] = {"stage": z.stage}
    zero.update({k: p[k] for k in ZERO_KNOBS if p[k] is not None})
    if z.stage >= 1:
        zero["offload_optimizer"] = _offload(cfg, z.offload_optimizer)
    if z.stage == 3:
        zero["offload_param"] = _offload(cfg, z.offload_params)
    ds: dict[str, Any] = {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.accumulation,
        "gradient_clipping": t.grad_clip,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", **(fp16_scaling(cfg) if precision == "fp16" else {})},
        "zero_optimization": zero,
        # Any torch optimizer may be sharded (DeepSpeed only vouches for its Adam family).
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,   # the trainer logs progress; DeepSpeed need not
    }
    if p.use_deepspeed_optimizer:
        ds["optimizer"] = optimizer_section(cfg)
    elif z.offload_optimizer:
        # DeepSpeed refuses a torch optimizer on offloaded states unless told; it steps on the CPU
        # either way (slower than DeepSpeedCPUAdam, bit-for-bit the torch path).
        ds["zero_force_ds_cpu_optimizer"] = False
    return ds


# Old names DeepSpeed still reads but refuses beside the new ones, which the generated config always has.
RENAMED_ZERO_KEYS = {"stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save"}


def _renamed(user: dict) -> dict:
    zero = user.get("zero_optimization")
    if isinstance(zero, dict):
        for old, new in RENAMED_ZERO_KEYS.items():
            if old in zero:
                zero.setdefault(new, zero.pop(old))
    return user


def load_user_config(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError("parallel.ds_config", f"no such file: {path}")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("parallel.ds_config", f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("parallel.ds_config", f"{path} must hold a JSON object, got {type(data).__name__}")
    return _renamed(data)


def _owned(cfg: Config, world_size: int, generated: dict) -> dict[tuple, tuple[Any, str]]:
    """DeepSpeed key -> (the run's value, the run setting it comes from, as the user would type it)."""
    t, z, layout = cfg.trainer, cfg.zero, batch(cfg, world_size)
    precision = f"precision={cfg.precision.name}"
    fp16_hint = "" if has_fp16_hardware(cfg) else " (fp16 cannot run on this CPU; precision=bf16 can)"
    owned = {
        ("train_batch_size",): (layout.global_batch, f"trainer.global_batch_size={layout.global_batch}"),
        ("train_micro_batch_size_per_gpu",): (layout.micro_batch, f"trainer.micro_batch_size={layout.micro_batch}"),
        ("gradient_accumulation_steps",): (layout.accumulation, f"{layout.accumulation} = trainer.global_batch_size "
                                                                f"{layout.global_batch} / (trainer.micro_batch_size "
                                                                f"{layout.micro_batch} x {layout.dp} ranks)"),
        ("gradient_clipping",): (t.grad_clip, f"trainer.grad_clip={t.grad_clip}"),
        ("fp16", "enabled"): (cfg.precision.name == "fp16", precision + fp16_hint),
        ("bf16", "enabled"): (cfg.precision.name == "bf16", precision),
        ("zero_optimization", "stage"): (z.stage, f"zero.stage={z.stage}"),
    }
    if cfg.precision.name == "fp16":
        scaling = fp16_scaling(cfg)
        owned[("fp16", "loss_scale")] = (0, "precision=fp16 (dynamic loss scaling)")
        owned[("fp16", "initial_scale_power")] = (scaling["initial_scale_power"],
                                                  f"precision.init_scale={cfg.precision.init_scale}")
        owned[("fp16", "loss_scale_window")] = (scaling["loss_scale_window"],
                                                f"precision.growth_interval={cfg.precision.growth_interval}")
    for key, flag in (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params")):
        device = lookup(generated, ("zero_optimization", key, "device"))
        owned[("zero_optimization", key, "device")] = (
            "none" if device is MISSING else device, f"zero.{flag}={str(z[flag]).lower()}")
    return owned


def _check_optimizer(cfg: Config, user: dict, problems: list[str]) -> None:
    section = user.get("optimizer")
    if section is None:
        return
    if section == AUTO:
        section = user["optimizer"] = {}
    expected = optimizer_section(cfg)
    if expected is None:
        problems.append(f"optimizer (DeepSpeed's own) contradicts optimizer._target_={cfg.optimizer._target_}, "
                        f"which DeepSpeed does not build; delete the file's optimizer section")
        return
    got_type = section.get("type", AUTO)
    if got_type != AUTO and not same(got_type, expected["type"]):
        problems.append(f"optimizer.type={got_type} contradicts optimizer._target_={cfg.optimizer._target_}")
    params = section.get("params", {})
    for key, value in expected["params"].items():
        got = params.get(key, MISSING)
        if got is not MISSING and got != AUTO and not same(got, value):
            problems.append(f"optimizer.params.{key}={got} contradicts optimizer.{key}={value}")
    if cfg.parallel.use_deepspeed_optimizer:
        user["optimizer"] = {"type": expected["type"], "params": {**params, **expected["params"]}}
    else:
        # The section agrees with the optimizer group: the torch optimizer of that class steps with these
        # numbers (DeepSpeed's own build of it, DeepSpeedCPUAdam when offloading, is parallel.use_deepspeed_optimizer).
        del user["optimizer"]


# DeepSpeed's warm-up schedulers: their "auto" params filled from the run (name -> run value, run setting).
WARMUP_SCHEDULERS = ("WarmupLR", "WarmupDecayLR")


def _fill_scheduler(cfg: Config, user: dict, problems: list[str]) -> None:
    """A WarmupLR / WarmupDecayLR section runs in DeepSpeed instead of scheduler=; "auto" comes from the run."""
    section = user["scheduler"]
    if not isinstance(section, dict) or section.get("type") not in WARMUP_SCHEDULERS:
        return   # another scheduler passes through as written; an "auto" in it is reported as unfillable
    run = {"warmup_min_lr": (0.0, None), "warmup_max_lr": (cfg.optimizer.lr, "optimizer.lr"),
           "warmup_num_steps": (cfg.scheduler.warmup_steps, "scheduler.warmup_steps"),
           "warmup_type": ("linear", None)}
    if section["type"] == "WarmupDecayLR":
        run["total_num_steps"] = (cfg.trainer.max_steps, "trainer.max_steps")
    params = section.setdefault("params", {})
    for key, (value, setting) in run.items():
        got = params.get(key, MISSING)
        if got == AUTO:
            params[key] = value
        elif got is not MISSING and setting and not same(got, value):
            problems.append(f"scheduler.params.{key}={json.dumps(got)} contradicts {setting}={value}")


def reconcile(cfg: Config, world_size: int, generated: dict, user: dict, source: str) -> dict:
    """`generated` with the user's keys laid on top; raises ConfigError listing every contradiction."""
    user = copy.deepcopy(user)
    problems: list[str] = []
    for path, (value, setting) in _owned(cfg, world_size, generated).items():
        got = lookup(user, path)
        if got is MISSING:
            continue
        if got == AUTO:
            put(user, path, value)
        elif not same(got, value):
            problems.append(f"{'.'.join(path)}={json.dumps(got)} contradicts {setting}")
    defaults, p = _knob_defaults(), cfg.parallel
    knob_paths = {k: ("zero_optimization", k) for k in ZERO_KNOBS}
    knob_paths.update({k: ("fp16", k) for k in FP16_KNOBS})
    for knob, path in knob_paths.items():
        got = lookup(user, path)
        if got == AUTO:
            put(user, path, p[knob] if knob in ZERO_KNOBS or cfg.precision.name == "fp16" else defaults[knob])
        elif got is not MISSING and p[knob] != defaults[knob] and not same(got, p[knob]):
            problems.append(f"{'.'.join(path)}={json.dumps(got)} contradicts parallel.{knob}={p[knob]}")
    if "scheduler" in user:
        _fill_scheduler(cfg, user, problems)
    _check_optimizer(cfg, user, problems)
    problems += [f'{".".join(path)}="auto" has no run setting to fill it; give a value' for path in autos(user)]
    if problems:
        raise ConfigError(source, "; ".join(problems) + ' (set run-owned keys to "auto" or remove them: '
                                                        "the run's config groups are the source of truth)")
    merged = deep_merge(generated, user)
    if "optimizer" in merged:
        merged.pop("zero_force_ds_cpu_optimizer", None)
    return merged


def resolve(cfg: Config, world_size: int) -> dict:
    generated = generate(cfg, world_size)
    p = cfg.parallel
    overrides = OmegaConf.to_container(p.overrides, resolve=True) if p.overrides else {}
    user = load_user_config(p.ds_config) if p.ds_config else {}
    if not user and not overrides:
        choose_adam_kernel(cfg, generated, "parallel.use_deepspeed_optimizer")
        return generated
    source = f"parallel.ds_config ({p.ds_config})" if p.ds_config else "parallel.overrides"
    if p.ds_config and overrides:
        source = f"parallel.ds_config ({p.ds_config}) with parallel.overrides"
    # A null in parallel.overrides deletes that key of the file (e.g. its scheduler section).
    resolved = reconcile(cfg, world_size, generated, deep_merge(user, overrides, none_deletes=True), source)
    if lookup(resolved, ("fp16", "enabled")) is True and not has_fp16_hardware(cfg):
        raise ConfigError(source, "fp16.enabled=true cannot run here: DeepSpeed's CPU accelerator has no fp16; "
                                  "use precision=bf16 and set fp16.enabled to \"auto\"")
    choose_adam_kernel(cfg, resolved, source)
    return resolved


def write(ds: dict, run_dir: str) -> str:
    path = os.path.join(run_dir, "ds_config.json")
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(ds, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path
