"""Bytes of parameters, gradients, optimizer states and fp32 master copies on one rank: the same
quantities the job measures (`param_bytes`, `grad_bytes`, `optim_state_bytes`, `master_param_bytes`
in metrics.jsonl), computed from shapes and the rules each strategy's library follows."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from framework.objectives.registry import frozen_reference
from framework.plan.layout import Layout
from framework.plan.shapes import ParamShape, meta_model

if TYPE_CHECKING:
    from framework.config.schema import Config

FP32 = 4
STEP_BYTES = 4      # torch's Adam/AdamW keep `step` as a float32 scalar tensor per parameter


@dataclass(frozen=True)
class ModelStates:
    params: int
    grads: int
    optimizer: int
    master: int
    offloaded: int = 0          # of the above, bytes that live in host memory (offload)
    # gradients exist for the whole step (DeepSpeed's partitions); torch's are set to None after each step
    # and made during backward, as the activations they replace are freed
    grads_whole_step: bool = False
    step_scratch: int = 0       # what a foreach Adam step allocates on a GPU: sqrt(v), one fp32 per element
    # a preference objective's frozen reference model, laid out as the parameters are (0: none, or LoRA's base
    # with the adapters off, which is no copy)
    reference: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.master + self.reference


# torchao's low-bit AdamW: bits a value, and the bytes of the quantisation map each quantised state holds
LOW_BIT = {"adamw8bit": (8, 256 * FP32), "adamw4bit": (4, 16 * FP32)}
LOW_BIT_MIN_NUMEL = 4096    # torchao quantises a (local) tensor of at least this many values, a multiple of the block


@dataclass(frozen=True)
class OptimizerKind:
    """Per-element state tensors and per-tensor scalars of the optimizer (of one algorithm of it): fp32, or
    quantised to `bits` a value with an fp32 scale a block (torchao), where a tensor is large enough."""
    moments: int
    scalars: int
    bits: int = 32
    block: int = 1
    qmap_bytes: int = 0

    @classmethod
    def of(cls, opt_cfg, algorithm: str | None = None) -> "OptimizerKind":
        target = opt_cfg._target_.rsplit(".", 1)[-1].lower()
        if algorithm == "muon" or target == "muon":
            return cls(moments=1, scalars=0)        # torch.optim.Muon's momentum_buffer, no step
        if target in LOW_BIT:
            bits, qmap = LOW_BIT[target]
            return cls(moments=2, scalars=1, bits=bits, block=opt_cfg.block_size, qmap_bytes=qmap)
        if target in ("adamw", "_adamw", "adam", "fusedadam", "deepspeedcpuadam", "muonwithadamw"):
            return cls(moments=2, scalars=1)
        if target == "sgd":
            return cls(moments=1 if opt_cfg.get("momentum", 0) else 0, scalars=0)
        return cls(moments=2, scalars=1)     # an optimizer we do not know: assume Adam-like

    def bytes_for(self, numel: int, value_bytes: float = FP32) -> int:
        """States of a (local) tensor of `numel` values whose parameter takes `value_bytes` a value: unquantised
        states take the parameter's dtype (bf16 ones under precision.store_dtype=bfloat16), the step stays fp32."""
        scalars = self.scalars * STEP_BYTES if numel else 0
        if self.bits < 32 and numel >= LOW_BIT_MIN_NUMEL and numel % self.block == 0:
            per_state = numel * self.bits // 8 + numel // self.block * FP32 + self.qmap_bytes
            return self.moments * per_state + scalars
        return round(self.moments * numel * value_bytes) + scalars


def decay_groups(shapes: list[ParamShape]) -> list[list[ParamShape]]:
    """Matrices, then the rest: the optimizer's groups without optimizer.groups (DeepSpeed's flat partitions)."""
    groups = [[s for s in shapes if len(s.full) >= 2], [s for s in shapes if len(s.full) < 2]]
    return [g for g in groups if g]


def optimizer_groups(cfg: Config, shapes: list[ParamShape]) -> list[tuple[OptimizerKind, list[ParamShape]]]:
    """This rank's trainable shapes in the optimizer's parameter groups, as the job's OptimizerFactory builds them
    from the model (optimizer.groups, Muon's split), each with the states its algorithm keeps."""
    from framework.models.spec import spec_for
    from framework.optim.factory import OptimizerFactory
    factory = OptimizerFactory(cfg.optimizer, spec_for(cfg.model).output_heads())
    by_name = {s.name: s for s in shapes if s.trainable}
    out, placed = [], set()
    for settings, members in factory.named_groups(meta_model(cfg)):
        mine = [by_name[name] for name, _ in members if name in by_name]
        placed.update(s.name for s in mine)
        if mine:
            out.append((OptimizerKind.of(cfg.optimizer, settings.get("algorithm")), mine))
    rest = [s for name, s in by_name.items() if name not in placed]     # a stage's own copy of a tied weight
    return out + [(OptimizerKind.of(cfg.optimizer, "adamw" if factory.split else None), g) for g in decay_groups(rest)]


def zero1_partition(groups: list[list[ParamShape]], world: int, rank: int = 0) -> list[ParamShape]:
    """torch's ZeroRedundancyOptimizer: each group's parameters, largest first, go whole to the rank
    holding the fewest elements so far."""
    sizes = [0] * world
    mine = []
    for group in groups:
        for s in sorted(group, key=lambda s: s.numel, reverse=True):
            r = sizes.index(min(sizes))
            sizes[r] += s.numel
            if r == rank:
                mine.append(s)
    return mine


def torch_model_states(shapes: list[ParamShape], layout: Layout,
                       groups: list[tuple[OptimizerKind, list[ParamShape]]]) -> ModelStates:
    """Replicas (zero: ZeroRedundancyOptimizer) and FSDP2 units (their shapes sharded already): parameters as
    stored (fp32, from which autocast or FSDP2's mixed-precision policy computes in low precision; bf16 under
    precision.store_dtype=bfloat16; a LoRA base as lora.base_dtype stores it), gradients of the same local shape
    and dtype for what trains, optimizer states in that dtype too; no master copy either way."""
    param_bytes = round(sum(s.numel * s.itemsize for s in shapes))
    trainable = [s for s in shapes if s.trainable]
    kind = {s.name: k for k, group in groups for s in group}
    stepped = [s for _, group in groups for s in group]
    if layout.sharding == "replicate" and "optimizer" in layout.shards:
        stepped = zero1_partition([group for _, group in groups], layout.world)
    opt = sum(kind[s.name].bytes_for(s.numel, s.itemsize) for s in stepped)
    offloaded = (param_bytes * 2 + opt) if layout.offload_params else 0
    grads = round(sum(s.grad_numel * s.itemsize for s in trainable))
    scratch = round(sum(s.numel * s.itemsize for s in stepped if kind[s.name].moments == 2))
    return ModelStates(params=param_bytes, grads=grads, optimizer=opt, master=0, offloaded=offloaded,
                       step_scratch=scratch)


def _ds_alignment_partition(total: int, world: int) -> int:
    """ZeRO-1/2 flatten a group aligned to 2 x world elements and split it evenly."""
    align = 2 * world
    return -(-total // align) * align // world


def deepspeed_model_states(shapes: list[ParamShape], layout: Layout, optimizer: OptimizerKind,
                           persistence_threshold: int) -> ModelStates:
    """DeepSpeed ZeRO: stage 1/2 flatten each optimizer group and step an fp32 copy of this rank's
    partition and keep only their partition of the averaged gradients; stage 3 partitions every
    parameter (ceil(numel / world) each) except those below the persistence threshold, which every rank
    also keeps whole, and in fp32 steps the partition itself."""
    world, compute = layout.world, layout.compute_bytes
    full = sum(s.full_numel for s in shapes)
    groups = decay_groups(shapes)
    if not layout.shards:
        opt = sum(optimizer.bytes_for(s.full_numel) for s in shapes)
        master = full * FP32 if compute != FP32 else 0
        return ModelStates(params=full * compute, grads=full * compute, optimizer=opt, master=master,
                           grads_whole_step=True)
    if "params" not in layout.shards:
        parts = [_ds_alignment_partition(sum(s.full_numel for s in g), world) for g in groups]
        part = sum(parts)
        opt = sum(optimizer.bytes_for(n) for n in parts)
        grads = part * compute          # stage 1 too: DeepSpeed reduces into the partition either way
        if layout.offload_optimizer:
            grads = part * FP32
        offloaded = (part * FP32 + opt + grads) if layout.offload_optimizer else 0
        return ModelStates(params=full * compute, grads=grads, optimizer=opt, master=part * FP32,
                           offloaded=offloaded, grads_whole_step=True)
    part_sizes = [-(-s.full_numel // world) for s in shapes]
    persistent = sum(s.full_numel for s in shapes if s.full_numel < persistence_threshold)
    part = sum(part_sizes)
    opt = sum(optimizer.bytes_for(sum(-(-s.full_numel // world) for s in g)) for g in groups)
    master = part * FP32 if compute != FP32 or layout.offload_optimizer else 0
    grads = part * (FP32 if layout.offload_optimizer else compute)
    return ModelStates(params=(part + persistent) * compute, grads=grads, optimizer=opt, master=master,
                       offloaded=(master + opt + grads) if layout.offload_optimizer else 0, grads_whole_step=True)


def model_states(cfg: Config, layout: Layout, shapes: list[ParamShape]) -> ModelStates:
    """The model states of the rank holding `shapes` (the first rank of its tp and data-parallel groups)."""
    if layout.sharding == "flat":
        threshold = layout.traits.flat_sizes(cfg)["persistence_threshold"]
        states = deepspeed_model_states(shapes, layout, OptimizerKind.of(cfg.optimizer), threshold)
    else:
        states = torch_model_states(shapes, layout, optimizer_groups(cfg, shapes))
    return replace(states, reference=states.params) if frozen_reference(cfg) else states
