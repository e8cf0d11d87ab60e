"""parallel=auto: enumerate the layouts a world size allows, keep those that divide and fit, rank them
by predicted step time, and rewrite the config to the winner (deterministic: layouts predicted within
TIE of the fastest are a tie, and the simplest of them is listed first and runs).

Each strategy says which layouts to try (Strategy.auto_layouts) and where it stands in "less machinery"
(Strategy.machinery); this module adds activation checkpointing and micro-batch sizes and ranks them."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict

from framework.errors import ConfigError
from framework.models.spec import spec_for
from framework.plan.hardware import Device
from framework.plan.planner import Plan, make_plan
from framework.strategies.registry import strategy_class, strategy_names

if TYPE_CHECKING:
    from framework.config.schema import Config

# Predicted step times this close are a tie: the planner's terms cannot separate them (its predictions
# scatter more than this against measured steps, benchmarks/plan_step_time.py). The simpler layout has
# less machinery per step than the model counts: on a 2-core CPU, DeepSpeed ZeRO-1/2 measured 7-11%
# slower than DDP that the plan put 0.1-1.8% apart (benchmarks/plan_auto_pick.py).
TIE = 0.02
#: the activation_checkpointing modes auto weighs, least recomputation first, and the group that selects each
AC_GROUP = {"none": "none", "layer": "selective", "full": "full"}


@dataclass(frozen=True)
class Candidate:
    strategy: str
    zero: int
    parallel: tuple           # (key, value) pairs for parallel.*
    ac: str
    micro_batch: int
    offload: bool = False     # DeepSpeed: optimizer states (and their fp32 master) in host memory

    def overrides(self) -> list[str]:
        out = [f"parallel={self.strategy}"]
        if self.zero:
            out.append(f"zero=stage{self.zero}")
        if self.offload:
            out.append("zero.offload_optimizer=true")
        out += [f"parallel.{k}={v}" for k, v in self.parallel]
        if self.ac != "none":
            out.append(f"activation_checkpointing={AC_GROUP[self.ac]}")
        out.append(f"trainer.micro_batch_size={self.micro_batch}")
        return out

    def settings(self) -> dict:
        """The keys besides parallel.* that this layout sets, in the trial copy and in the run alike."""
        return {"zero.stage": self.zero, "zero.offload_optimizer": self.offload,
                "activation_checkpointing.mode": self.ac, "trainer.micro_batch_size": self.micro_batch}

    def describe(self) -> str:
        """The overrides that differ from the strategy's defaults, for people."""
        p = dict(self.parallel)
        keep = []
        for key, value in self.parallel:
            # dp_shard is the whole world (its default) where nothing else divides it
            whole = p.get("dp_replicate", 1) == p.get("tp", 1) == p.get("pp", 1) == p.get("cp", 1) == 1
            if key in ("dp_replicate", "cp") and value == 1 or key == "pp_virtual_stages" and value == 1 \
                    or key == "pp_schedule" and p.get("pp", 1) == 1 or key == "sequence_parallel" and not value \
                    or key == "dp_shard" and whole:
                continue
            keep.append(f"{key}={value}")
        head = [f"parallel={self.strategy}"] + ([f"zero=stage{self.zero}"] if self.zero else []) \
            + (["offload_optimizer"] if self.offload else [])
        tail = ([f"ac={AC_GROUP[self.ac]}"] if self.ac != "none" else []) + [f"micro_batch={self.micro_batch}"]
        return " ".join(head + keep + tail)


def _micro_batches(global_batch: int, dp: int) -> list[int]:
    share = global_batch // dp if global_batch % dp == 0 else 0
    return [m for m in range(1, share + 1) if share % m == 0 and (m & (m - 1) == 0 or m == share)]


def candidates(cfg: Config, world: int, per_node: int, strategies: list[str]) -> list[Candidate]:
    """Each named strategy's layouts (in the order `strategies` lists them), each with every activation
    checkpointing mode and power-of-two micro-batch its data-parallel share allows."""
    spec = spec_for(cfg.model)
    acs = tuple(AC_GROUP) if spec.has_blocks(cfg.model) else ("none",)
    gb = cfg.trainer.global_batch_size
    out: list[Candidate] = []
    for name in strategies:
        for layout in strategy_class(name).auto_layouts(cfg, world, per_node):
            for ac in acs:
                for mb in _micro_batches(gb, layout.dp):
                    out.append(Candidate(name, layout.zero, tuple(layout.parallel), ac, mb, layout.offload))
    return out


def apply(cfg: Config, cand: Candidate) -> DictConfig:
    """A copy of cfg with the candidate's layout (parallel.* from the strategy's own schema)."""
    return _with_layout(_resolved(cfg), cand)


def _resolved(cfg: Config) -> DictConfig:
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def _with_layout(trial: DictConfig, cand: Candidate) -> DictConfig:
    parallel = OmegaConf.to_container(OmegaConf.structured(strategy_class(cand.strategy).options), resolve=True)
    parallel.update(dict(cand.parallel))
    parallel["name"] = cand.strategy      # a strategy on the base schema (single) leaves it MISSING
    trial.parallel = parallel
    for key, value in cand.settings().items():
        OmegaConf.update(trial, key, value)
    return trial


def _checked(trial, world: int) -> bool:
    cls = strategy_class(trial.parallel.name)
    try:
        cls.batch_layout(trial, world)
        cls.validate(trial, world)
    except ConfigError:
        return False
    return True


def rank_layouts(cfg: Config, world: int, device: Device, per_node: int,
                 time_on_device: bool = False) -> list[tuple[Candidate, Plan]]:
    """Every candidate that validates and fits, fastest first (stable: enumeration order breaks ties).
    `time_on_device`: as make_plan's (each distinct micro-batch, checkpointing and dtype is timed once)."""
    ranked = []
    resolved = _resolved(cfg)       # copied per candidate: a copy is cheaper than building the config again
    for cand in candidates(cfg, world, per_node, list(cfg.parallel.strategies or strategy_names())):
        trial = _with_layout(copy.deepcopy(resolved), cand)
        if not _checked(trial, world):
            continue
        plan = make_plan(trial, world, device, per_node, time_on_device)
        if plan.fits:
            ranked.append((cand, plan))
    if not ranked:
        raise ConfigError("parallel", f"parallel=auto: no layout of {world} x {device.name} fits this model and "
                                      f"batch; add devices or lower trainer.global_batch_size")
    ranked.sort(key=lambda cp: (round(cp[1].step_time_s, 12), cp[1].per_rank_bytes["total"]))
    tied = [cp for cp in ranked if cp[1].step_time_s <= ranked[0][1].step_time_s * (1 + TIE)]
    tied.sort(key=lambda cp: simplicity(cp[0]))        # stable: within equal machinery, the faster first
    return tied + ranked[len(tied):]


def simplicity(cand: Candidate) -> tuple:
    """Less machinery first: the strategy, then ZeRO stage, offload, model parallel ways, recomputation."""
    parallel = dict(cand.parallel)
    ways = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("cp", 1)
    return strategy_class(cand.strategy).machinery, cand.zero, cand.offload, ways, tuple(AC_GROUP).index(cand.ac)


def _why(ranked: list[tuple[Candidate, Plan]]) -> str:
    if len(ranked) == 1:
        return "the only layout that fits"
    (first, best), (runner_up, second) = ranked[:2]
    fastest = min(p.step_time_s for _, p in ranked)
    if second.step_time_s <= fastest * (1 + TIE) and simplicity(first) != simplicity(runner_up):
        return (f"#1 and #2 are predicted within {TIE:.0%} of the fastest, a tie the plan cannot separate; "
                f"#1 has less machinery ({first.strategy}, zero {first.zero})")
    if second.step_time_s <= best.step_time_s * (1 + 1e-9):
        return "tied with #2 on predicted step time; it needs less memory"
    a, b = best.time_s, second.time_s
    diffs = {k: b[k] - a[k] for k in a}
    key = max(diffs, key=diffs.get)
    reason = {"compute": "less compute time (fewer micro-batches, less recomputation, smaller bubble)",
              "optimizer": "a shorter optimizer step (its states sharded over more ranks)",
              "tp": "less tensor-parallel traffic", "pp": "less pipeline traffic",
              "cp": "less context-parallel key/value traffic",
              "ep": "less expert-parallel token traffic",
              "dp": "less exposed data-parallel traffic", "offload": "less offload traffic"}[key]
    return f"{(second.step_time_s / best.step_time_s - 1):.1%} faster than the next: {reason}"


def report(ranked: list[tuple[Candidate, Plan]], top: int) -> str:
    gib = 1024 ** 3
    lines = [f"parallel=auto: {len(ranked)} layouts fit; the best {min(top, len(ranked))}:",
             f"  {'#':<3}{'layout':<72}{'memory':>10}{'step s':>10}{'tokens/s':>12}{'MFU':>7}"]
    for i, (cand, plan) in enumerate(ranked[:top], 1):
        lines.append(f"  {i:<3}{cand.describe():<72}{plan.per_rank_bytes['total'] / gib:>8.2f}G"
                     f"{plan.step_time_s:>10.4g}{plan.tokens_per_sec:>12,.0f}{plan.mfu:>7.1%}")
    lines.append(f"picked #1: {_why(ranked)}")
    return "\n".join(lines)


def choose_layout(cfg: Config, world: int, device: Device, per_node: int,
                  time_on_device: bool = False) -> tuple[str, list]:
    """Rewrite cfg (in place) to the fastest layout that fits; return the report and the ranking."""
    ranked = rank_layouts(cfg, world, device, per_node, time_on_device)
    top = cfg.parallel.top
    best = ranked[0][0]
    with open_dict(cfg):
        cfg.parallel = apply(cfg, best).parallel
        for key, value in best.settings().items():
            OmegaConf.update(cfg, key, value)
    return report(ranked, top), ranked
