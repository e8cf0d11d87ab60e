"""The numbers of a job's layout the planner reasons about, read from a validated config.

What depends on the strategy is read from its class (through the registry): how it spreads model states
over the data-parallel ranks (`sharding`), what its zero stage shards (`shards`), whether it reduces
gradients every micro-batch, its mesh degrees and model-parallel dims. The planner never compares a
strategy's name, so a strategy registered in its own file is planned as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from framework.objectives.registry import class_of
from framework.parallel.batch_layout import batch_layout
from framework.parallel.precision import stores_bf16
from framework.strategies.registry import strategy_class

if TYPE_CHECKING:
    from framework.config.schema import Config


class Casting(NamedTuple):
    """How a job meets its low precision: weights the wrapper already cast to it (FSDP2's policy, DeepSpeed's
    bf16 module), autocast around the forward, or both (3d's FSDP units under autocast)."""
    weights: bool = False
    autocast: bool = True


@dataclass(frozen=True)
class Layout:
    strategy: str               # parallel.name: a registered strategy
    world: int
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    zero: int
    offload_optimizer: bool
    offload_params: bool
    sequence_parallel: bool
    pp_schedule: str
    pp_microbatches: int        # pipeline micro-batches per step (1 without a pipeline)
    virtual_stages: int
    ac: str                     # activation_checkpointing.mode: none | full | layer | op
    ac_every: int
    micro_batch: int            # sequences per forward on one rank
    accumulation: int           # forwards per optimizer step on one rank (pipeline: its micro-batches)
    seq_len: int
    precision: str              # fp32 | bf16 | fp16 | float8
    cp: int = 1                 # context parallel: ranks that split each sequence (3d)
    ep: int = 1                 # expert parallelism: MoE experts sharded over this many data-parallel ranks
    float8_gather: bool = False  # FSDP2 all-gathers the blocks' linear weights in float8 (tensorwise recipe)
    casting: Casting = Casting()

    @property
    def shard_ranks(self) -> int:
        """Ranks FSDP2 shards a parameter over: dp_shard x cp (3d's dp_shard_cp)."""
        return self.dp_shard * self.cp

    @property
    def local_seq_len(self) -> int:
        """Positions of each sequence one rank holds."""
        return self.seq_len // self.cp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def traits(self):
        """The strategy's class: what the planner reads about it (framework/strategies/traits.py)."""
        return strategy_class(self.strategy)

    @property
    def sharding(self) -> str:
        """replicate | unit (FSDP2) | flat (DeepSpeed ZeRO): Strategy.dp_sharding."""
        return self.traits.dp_sharding

    @property
    def shards(self) -> frozenset[str]:
        """What this zero stage keeps one shard of per rank: "optimizer", "grads", "params"."""
        return self.traits.shards(self.zero)

    @property
    def reduces_every_micro_batch(self) -> bool:
        return self.traits.reduces_every_micro_batch

    @property
    def shards_params(self) -> bool:
        """Parameters held as shards: FSDP2 over more than one rank (fsdp, 3d at stage2/3) or DeepSpeed ZeRO-3."""
        return "params" in self.shards and (self.shard_ranks > 1 or self.sharding != "unit")

    @property
    def compute_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    def describe(self) -> str:
        parts = [f"parallel={self.strategy}"]
        if self.zero:
            parts.append(f"zero=stage{self.zero}")
        if self.sharding == "unit" and self.dp_replicate > 1:
            parts.append(f"dp_replicate={self.dp_replicate}")
        if self.traits.model_parallel_dims:
            parts += [f"tp={self.tp}", f"pp={self.pp}"] + ([f"ep={self.ep}"] if self.ep > 1 else [])
            if self.pp > 1:
                parts.append(f"pp_schedule={self.pp_schedule}")
            if self.sequence_parallel:
                parts.append("sp")
            if self.cp > 1:
                parts.append(f"cp={self.cp}")
        if self.ac != "none":
            parts.append(f"ac={self.ac}")
        parts.append(f"micro_batch={self.micro_batch}")
        return " ".join(parts)


def layout_of(cfg: Config, world_size: int) -> Layout:
    """The layout of a validated config (micro_batch_size filled in) on `world_size` processes; its micro-batch
    in sequences (a preference pair is two)."""
    p = cfg.parallel
    name = p.name
    traits = strategy_class(name)
    dims = traits.mesh_dims(cfg, world_size)
    rep, shard, tp, pp, cp = dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp, dims.cp
    batch = batch_layout(cfg, rep * shard, pp)
    virtual = p.get("pp_virtual_stages", 1) if pp > 1 else 1
    return Layout(
        strategy=name, world=world_size, dp_replicate=rep, dp_shard=shard, tp=tp, pp=pp, zero=cfg.zero.stage,
        offload_optimizer=bool(cfg.zero.offload_optimizer), offload_params=bool(cfg.zero.offload_params),
        sequence_parallel=bool(p.get("sequence_parallel", False)) and tp > 1,
        pp_schedule=p.get("pp_schedule", "1F1B"), pp_microbatches=batch.pipeline_microbatches, virtual_stages=virtual,
        ac=cfg.activation_checkpointing.mode, ac_every=cfg.activation_checkpointing.every_n_layers,
        micro_batch=batch.forward_batch * class_of(cfg).rows_per_example, accumulation=batch.accumulation,
        seq_len=cfg.data.seq_len, precision=cfg.precision.name, cp=cp,
        ep=p.get("ep", 1) if "ep" in traits.model_parallel_dims else 1,
        float8_gather=cfg.precision.name == "float8" and cfg.precision.get("float8_recipe") == "tensorwise",
        casting=Casting(weights=traits.casts_weights(cfg, world_size) or stores_bf16(cfg.precision),
                        autocast=traits.precision_autocast and not stores_bf16(cfg.precision)))
