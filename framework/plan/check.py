"""Before launch: the plan for the job's device, and a refusal with the cheapest change that fits."""
from __future__ import annotations

from omegaconf import OmegaConf
from typing import TYPE_CHECKING

from framework.errors import ConfigError
from framework.plan.hardware import Device, detected_device, device_named
from framework.plan.planner import MEMORY_OVERESTIMATE, Plan, make_plan
from framework.strategies.registry import strategy_class

if TYPE_CHECKING:
    from framework.config.schema import Config

GIB = 1024 ** 3


def planned_device(cfg: Config) -> Device | None:
    return device_named(cfg.planner.device) if cfg.planner.device else detected_device()


def gpus_per_node(cfg: Config, launcher_world: int, device: Device) -> int:
    """The one rule (the memory check, parallel=auto, python -m framework.plan): planner.gpus_per_node,
    else the job's launcher.nproc_per_node, else the launcher's world on a CPU, else 8 for a GPU."""
    return cfg.planner.gpus_per_node or cfg.launcher.nproc_per_node or (launcher_world if device.name == "cpu" else 8)


def planned_world(cfg: Config, launcher_world: int, device: Device) -> tuple[int, int]:
    """(world size, GPUs per node) the plan is for: planner.nodes x gpus_per_node. A single node whose
    planner.gpus_per_node is not given is planned at the launcher's world size."""
    per_node = gpus_per_node(cfg, launcher_world, device)
    if cfg.planner.gpus_per_node is None and cfg.planner.nodes == 1:
        return launcher_world, per_node
    return cfg.planner.nodes * per_node, per_node


def _variants(cfg: Config):
    """Cheaper-to-run changes first: recompute, more sharding (the next zero stage, where the strategy
    takes it), smaller micro-batches, model parallelism (the strategy's tp and pp dims)."""
    strategy, ac, z = strategy_class(cfg.parallel.name), cfg.activation_checkpointing.mode, cfg.zero.stage
    if ac != "full":
        yield "activation_checkpointing=full", {"activation_checkpointing.mode": "full"}
    if z + 1 in strategy.accepted_zero_stages():
        yield f"zero=stage{z + 1}", {"zero.stage": z + 1}
    mb = cfg.trainer.micro_batch_size
    while mb and mb > 1:        # halved until it fits: the loss's fp32 logits grow with it too
        mb //= 2
        yield f"trainer.micro_batch_size={mb}", {"trainer.micro_batch_size": mb}
    for dim in ("tp", "pp"):
        if dim in strategy.model_parallel_dims:
            yield f"parallel.{dim}={cfg.parallel[dim] * 2}", {f"parallel.{dim}": cfg.parallel[dim] * 2,
                                                              "parallel.dp_shard": -1}


def cheapest_fit(cfg: Config, world: int, device: Device, per_node: int, validate) -> str | None:
    fitting = []
    for text, changes in _variants(cfg):
        trial = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
        for key, value in changes.items():
            OmegaConf.update(trial, key, value)
        try:
            validate(trial)
            plan = make_plan(trial, world, device, per_node)
        except (ConfigError, ValueError):
            continue
        if plan.fits:
            fitting.append((plan.step_time_s, text))
    return min(fitting)[1] if fitting else None


def refuse_if_it_cannot_fit(cfg: Config, launcher_world: int, validate) -> Plan | None:
    """Raise ConfigError where the most loaded rank needs more than the device holds."""
    if not cfg.planner.check:
        return None
    device = planned_device(cfg)
    if device is None:
        return None
    world, per_node = planned_world(cfg, launcher_world, device)
    plan = make_plan(cfg, world, device, per_node)
    if not plan.refused:
        return plan
    need = plan.per_rank_bytes
    parts = ", ".join(f"{k} {need[k] / GIB:.1f}" for k in ("params", "grads", "optimizer", "master", "reference",
                                                          "activations", "buffers") if need.get(k))
    fix = cheapest_fit(cfg, world, device, per_node, validate)
    hint = f"the cheapest change that fits: {fix}" if fix else "no single change fits: add devices"
    raise ConfigError("planner", f"the most loaded rank needs {need['total'] / GIB:.1f} GiB ({parts}) but one "
                                 f"{device.name} holds {device.memory_bytes / GIB:.1f} GiB, over by "
                                 f"{plan.over_by:.0%} (more than the {MEMORY_OVERESTIMATE:.0%} the planner has "
                                 f"over-estimated measured jobs by); {hint} "
                                 f"(planner.check=false skips this check)")
