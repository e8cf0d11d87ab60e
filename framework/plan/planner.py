"""One plan: per-rank memory, communication, pipeline bubble and step time of a validated job."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from framework.metrics.mfu import matmul_dtype
from framework.models.spec import spec_for
from framework.parallel.pipeline import stage_ids
from framework.plan import activations, attention_kernel, device_timing, gpu_time, op_costs
from framework.plan.comm import block_of, collective_calls, comm_bytes, tp_linears
from framework.plan.experts import all_to_all_bytes, expert_summary
from framework.plan.cpu_calibration import measured_timing, tensor_parallel_overhead_s
from framework.plan.hardware import Device
from framework.plan.layout import Layout, layout_of
from framework.plan.model_states import ModelStates, OptimizerKind, model_states
from framework.plan.shapes import rank_parameters

if TYPE_CHECKING:
    from framework.config.schema import Config

LOOPED = ("interleaved1f1b", "loopedbfs", "interleavedzerobubble")
ALL_FORWARDS_FIRST = ("gpipe", "loopedbfs")
OPS_PER_BLOCK = 120      # operator calls of one transformer block, forward and backward
ZERO_BUBBLE = ("interleavedzerobubble", "zbvzerobubble", "dualpipev")
# The most the planned peak has exceeded a measured one (planned / measured - 1 over the H100 jobs of
# docs/benchmarks/h100.md; tests/integration/plan/test_plan_gpu.py holds every row under it): a plan over the
# device by less than this may still run, so only a larger excess is refused before launch
MEMORY_OVERESTIMATE = 0.05


@dataclass
class Plan:
    layout: Layout
    device: str
    capacity_bytes: int
    per_rank_bytes: dict
    comm_bytes_per_step: dict
    bubble: float
    step_time_s: float
    tokens_per_sec: float
    mfu: float
    fits: bool
    time_s: dict            # compute (bubble and recompute included) and exposed tp / pp / dp communication
    experts: dict = field(default_factory=dict)   # MoE: total / active parameters, expert weights per rank
    step_time_from: str = "modelled"    # or where the job's own model was timed

    @property
    def over_by(self) -> float:
        """How far the planned peak exceeds the device, as a share of its memory (<= 0: it fits)."""
        return self.per_rank_bytes["total"] / self.capacity_bytes - 1

    @property
    def refused(self) -> bool:
        """Over the device by more than the planner has been seen to over-estimate."""
        return self.over_by > MEMORY_OVERESTIMATE

    def as_json(self) -> dict:
        out = asdict(self)
        out["layout"] = self.layout.describe()
        return out


def bubble(layout: Layout) -> float:
    """The idle share of a pipeline step: (p-1)/(m+p-1), /v interleaved; zero-bubble schedules fill most."""
    p, m, v = layout.pp, layout.pp_microbatches, layout.virtual_stages
    if p == 1:
        return 0.0
    name = layout.pp_schedule.lower()
    idle = (p - 1) / (v * m + p - 1)
    return idle / 3 if name in ZERO_BUBBLE else idle


def _in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak."""
    m, p, v = layout.pp_microbatches, layout.pp, layout.virtual_stages
    name = layout.pp_schedule.lower()
    if name in ALL_FORWARDS_FIRST:
        return m
    held = min(m, p - pp_rank)
    return held * (1 + (p - 1) / (p * v)) if name in LOOPED else held


def holds_head(layout: Layout, pp_rank: int) -> bool:
    """Pipeline rank `pp_rank` holds the last stage (the head): the last rank, or rank 0 of a V schedule."""
    if layout.pp == 1:
        return True
    stages = stage_ids(pp_rank, layout.pp, layout.virtual_stages, layout.pp_schedule)
    return layout.pp * layout.virtual_stages - 1 in stages


def _model_dims(cfg: Config) -> tuple[int, int, int]:
    m = cfg.model
    hidden = m.get("dim") or m.get("n_embd") or m.get("hidden_size") or 0
    vocab = m.get("vocab_size") or cfg.data.vocab_size
    layers = m.get("n_layers") or m.get("num_hidden_layers") or 1
    return int(hidden), int(vocab), int(layers)


def _kv_dim(cfg: Config) -> int:
    """Width of the keys (all heads): what context parallelism gathers per token and block."""
    m = cfg.model
    heads = m.get("n_heads") or m.get("num_attention_heads") or 1
    kv_heads = m.get("n_kv_heads") or m.get("num_key_value_heads") or heads
    return int(kv_heads) * (_model_dims(cfg)[0] // int(heads))


def _gathered_kv_bytes(cfg: Config, layout: Layout, blocks: int) -> int:
    """What each block's attention keeps for backward under context parallelism beyond a plain forward of
    the rank's share: the keys and values of the rest of the sequence (cp - 1 of cp shares), and a second
    copy of its output (each query chunk's attention keeps its own output, which are then joined into the
    tensor the output projection keeps); a checkpointed block keeps its input alone."""
    if layout.cp == 1:
        return 0
    kept = {"none": blocks, "full": 0}.get(layout.ac, blocks - blocks // max(1, layout.ac_every))
    rest = layout.seq_len - layout.local_seq_len
    kv = 2 * rest * (_kv_dim(cfg) // layout.tp)
    chunk_outputs = layout.local_seq_len * (_model_dims(cfg)[0] // layout.tp)
    return kept * layout.micro_batch * (kv + chunk_outputs) * layout.compute_bytes


def _unit_numels(shapes) -> list[int]:
    """Parameter elements per FSDP unit (a block, or the root's own parameters)."""
    units: dict[str, int] = {}
    for s in shapes:
        parts = s.name.split(".")
        key = ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else "root"
        units[key] = units.get(key, 0) + s.tp_numel
    return list(units.values())


def _activations(cfg: Config, layout: Layout, pp_rank: int, kernel: str = attention_kernel.FUSED) -> tuple[int, int]:
    """(bytes held after the forwards in flight, one block's recompute) for pipeline rank `pp_rank`, with
    attention on `kernel`."""
    # one sequence, scaled by the micro-batch (but autocast's weight copies, made once)
    profile = activations.measure(cfg, 1, layout.local_seq_len, layout.cp, kernel, layout.casting)
    if cfg.trainer.get("compile") and layout.ac == "none":
        profile = profile.compiled        # a checkpointed block keeps its input alone, compiled or not
    scale = layout.micro_batch
    n_blocks = len(profile.blocks)
    stages = layout.pp * layout.virtual_stages
    per_stage = max(1, n_blocks // stages)
    if layout.pp == 1:
        ids, first, last = list(range(n_blocks)), True, True
        held = scale * profile.stage_bytes(ids, first, last, layout.tp, layout.sequence_parallel)
        held += profile.stage_copies(ids, first, last, layout.tp) + _gathered_kv_bytes(cfg, layout, len(ids))
    else:
        mine = stage_ids(pp_rank, layout.pp, layout.virtual_stages, layout.pp_schedule)
        ids = [b for s in mine for b in range(s * per_stage, (s + 1) * per_stage)]
        per_mb = profile.stage_bytes(ids, 0 in mine, stages - 1 in mine, layout.tp, layout.sequence_parallel)
        held = int((scale * per_mb + _gathered_kv_bytes(cfg, layout, len(ids))) * _in_flight(layout, pp_rank))
        held += profile.stage_copies(ids, 0 in mine, stages - 1 in mine, layout.tp)
    # a checkpointed block's backward holds what its recompute kept, and the gradients of its largest tensor
    # and of the one before it
    recompute = scale * (profile.block_full + 2 * profile.block_largest) // layout.tp if layout.ac != "none" else 0
    return held, recompute


def _buffers(cfg: Config, layout: Layout, shapes, recompute: int, vocab: int) -> int:
    units = _unit_numels(shapes) or [0]
    gather = 4 if layout.precision == "fp32" else 2
    tokens = layout.micro_batch * layout.local_seq_len
    chunk = cfg.model.get("loss_chunk_tokens") or 0
    scored = min(tokens, chunk) if chunk else tokens
    # log_softmax's backward holds the fp32 gradients of the log-probabilities and of the logits at once
    # (whole on every tp rank); a checkpointed block is recomputed later, when they are gone
    total = max(recompute, 2 * scored * vocab * 4)
    if layout.traits.gradient_copy(cfg):
        total += sum(s.numel for s in shapes) * 4          # DDP's buckets: a second copy of the gradients
    elif layout.sharding == "unit" and layout.shard_ranks > 1:
        # gathered unit + prefetch (or, kept gathered to backward, every unit), the reduce-scatter's input
        gathered = sum(units) if layout.traits.keeps_gathered(layout.zero) else 2 * max(units)
        total += gathered * gather + max(units) * 4
    elif layout.sharding == "flat":
        sizes = layout.traits.flat_sizes(cfg)
        if "params" in layout.shards:
            total += 4 * max(units) + min(sizes["prefetch_bucket"], sum(units)) * layout.compute_bytes
        elif layout.shards:
            total += min(sizes["reduce_bucket"], sum(units)) * layout.compute_bytes
    return total


def peak_bytes(states: ModelStates, layout: Layout, transient: int, scratch: int) -> dict:
    """The larger of the two peaks of a step, and which: backward's start (activations and what the loss
    and recompute allocate, with only the gradients that outlive a step or a micro-batch) or its end and
    the optimizer step (every gradient, and the step's scratch)."""
    resident = states.total - states.offloaded
    grads = 0 if layout.offload_params else states.grads
    if states.grads_whole_step or layout.accumulation > 1:
        backward = resident + transient
    else:       # gradients appear as the activations they replace are freed: whichever side is larger
        backward = resident - grads + max(transient, grads)
    step = resident + scratch
    return {"step_scratch": scratch, "total": max(backward, step),
            "peak_at": "backward" if backward >= step else "optimizer step"}


def _peak(device: Device, precision_cfg) -> float:
    """The dense peak of the dtype the step's FLOPs are counted in (metrics.mfu.matmul_dtype: float8's
    attention and head run in bf16, its converted linears are planned at the device's fp8 peak)."""
    return device.peak_flops.get(matmul_dtype(precision_cfg)) or device.peak_flops.get("fp32")


def _optimizer_share(cfg: Config, per_rank: dict) -> float:
    """The rank's share of the whole model's optimizer work (its states, sharded by zero / fsdp / tp / pp)."""
    kind = OptimizerKind.of(cfg.optimizer)
    return per_rank["optimizer"] / kind.bytes_for(spec_for(cfg.model).num_params(cfg.model)) if kind.moments else 1.0


def _gpu_seconds(cfg: Config, layout: Layout, device: Device, per_rank: dict, pp_rank: int,
                 time_on_device: bool) -> tuple[float, float, str]:
    """(forward + backward of the rank's micro-batches, its optimizer step, where that came from) on a GPU:
    timed on it where it is this host's (plan/device_timing.py), else from the job's own operators
    (plan/op_costs, plan/gpu_time). Blocks split over pipeline stages, tp and cp; the embedding, head and
    loss run where their stage is."""
    mb = layout.micro_batch
    timing = None
    if time_on_device and device.torch_device and cfg.planner.time_on_device:
        timing = device_timing.timed_on_device(cfg, mb, layout.seq_len, layout.casting, device.torch_device)
    modelled_step = gpu_time.optimizer_step_s(per_rank["params"], per_rank["grads"], per_rank["optimizer"],
                                              per_rank["master"], device.hbm_bw)
    if timing is not None:
        block, rest = timing.block_s, timing.rest_s
        source = f"timed on this {device.name}"
        if layout.casting.weights:      # the timed model steps bf16 weights, the job its fp32 shards
            optimizer_s = modelled_step
            source += " (optimizer step modelled)"
        else:
            optimizer_s = timing.optimizer_s * _optimizer_share(cfg, per_rank)
    else:
        costs = op_costs.traced_per_sequence(cfg, layout.seq_len, attention_kernel.on_gpu(cfg))
        peak = _peak(device, cfg.precision)
        matmul_peak = device.fp8_flops if layout.precision == "float8" and device.fp8_flops else peak
        compiled = bool(cfg.trainer.get("compile"))
        seq = layout.local_seq_len          # what each attention kernel runs on
        block = gpu_time.part_time(costs, "block", mb, matmul_peak, peak, device.hbm_bw, compiled, seq).total
        rest = gpu_time.part_time(costs, "rest", mb, peak, peak, device.hbm_bw, False, seq).total
        optimizer_s, source = modelled_step, "modelled"
    if layout.pp > 1:
        stages = stage_ids(pp_rank, layout.pp, layout.virtual_stages, layout.pp_schedule)
        ends = (0 in stages) + (layout.pp * layout.virtual_stages - 1 in stages)
        rest *= ends / 2            # embedding on the first stage, head and loss on the last (most of it)
        block /= layout.pp
    per_micro = (block + rest) / (layout.tp * layout.cp)
    return layout.accumulation * per_micro, optimizer_s, source


def make_plan(cfg: Config, world_size: int, device: Device, gpus_per_node: int, time_on_device: bool = False) -> Plan:
    """The plan of the most loaded rank of a validated config on `world_size` processes. `time_on_device`:
    where `device` is this host's GPU, time the job's model on it (python -m framework.plan; a launch does
    not, as its check needs memory only and the GPU is the workers')."""
    layout = layout_of(cfg, world_size)
    hidden, vocab, n_layers = _model_dims(cfg)
    kernel = attention_kernel.FUSED if device.cores else attention_kernel.on_gpu(cfg)
    best = None
    for pp_rank in sorted({0, layout.pp - 1}):     # the ends: embedding / head and most micro-batches in flight
        shapes = rank_parameters(cfg, layout, pp_rank)
        states = model_states(cfg, layout, shapes)
        held, recompute = _activations(cfg, layout, pp_rank, kernel)
        buffers = _buffers(cfg, layout, shapes, recompute, vocab)
        per_rank = {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
                    "master": states.master, "reference": states.reference, "activations": held, "buffers": buffers,
                    "offloaded": states.offloaded}
        scratch = 0 if device.cores else states.step_scratch     # a CPU Adam steps tensor by tensor
        per_rank.update(peak_bytes(states, layout, held + buffers, scratch))
        if best is None or per_rank["total"] > best[0]["total"]:
            best = (per_rank, shapes, pp_rank)
    per_rank, shapes, pp_rank = best
    comm = comm_bytes(layout, shapes, hidden, vocab, n_layers, last_stage=holds_head(layout, pp_rank),
                      kv_dim=_kv_dim(cfg))
    comm.update(all_to_all_bytes(cfg, layout, shapes))

    spec = spec_for(cfg.model)
    tokens_per_step = cfg.trainer.global_batch_size * layout.seq_len
    flops_per_token = spec.flops_per_token(cfg.model, layout.seq_len)
    # op keeps matmul and attention outputs, all or every nth (save_every_nth_matmul): what it recomputes
    # besides the other matmuls (norms, activations) has no FLOPs to speak of
    kept_matmuls = 1 / cfg.activation_checkpointing.save_every_nth_matmul
    recompute = {"full": 4 / 3, "layer": 1 + 1 / (3 * max(1, layout.ac_every)),
                 "op": 1 + (1 - kept_matmuls) / 3}.get(layout.ac, 1.0)
    peak = _peak(device, cfg.precision)
    timed = None
    step_time_from = "modelled"
    fits = per_rank["total"] <= device.memory_bytes
    if not device.cores:        # a GPU: the job timed on it (one that cannot run is not), or its operators by class
        compute_s, optimizer_s, step_time_from = _gpu_seconds(cfg, layout, device, per_rank, pp_rank,
                                                              time_on_device and fits)
    else:
        if layout.precision == "fp32":
            # Timed on every core: workers of a job share the host's memory bandwidth and caches, so one
            # worker's core does what a core does while all are busy (two 1-thread workers each take ~1.5x
            # the time one alone takes), not what it does alone.
            timed = measured_timing(cfg, layout.micro_batch, layout.seq_len, device.cores, flops_per_token, peak,
                                    device.efficiency)
        compute_s = (flops_per_token * tokens_per_step / world_size * recompute
                     / (device.worker_peak(peak, world_size) * (timed.efficiency if timed else device.efficiency)))
        if timed is None:
            # each micro-batch pays operator overheads per block, whatever its size: fewer, larger ones are
            # cheaper (a timed micro-batch has them in its time already)
            blocks = n_layers // layout.pp
            compute_s += layout.accumulation * blocks * OPS_PER_BLOCK * recompute * device.op_overhead_s
            optimizer_s = 0.0
        else:
            # the rank steps its share of the optimizer states (sharded by zero / fsdp / tp / pp)
            optimizer_s = timed.optimizer_s * _optimizer_share(cfg, per_rank)
            step_time_from = "timed on this CPU"
    if timed is not None and layout.tp > 1:
        # the timed model is plain tensors, and whole: a tensor-parallel rank (holding 1/pp of the blocks)
        # also pays DTensor's dispatch and what tp does not split
        compute_s += (layout.accumulation * recompute / layout.pp
                      * tensor_parallel_overhead_s(cfg, layout.seq_len, layout.tp, layout.sequence_parallel))
    idle = bubble(layout)
    compute_s /= (1 - idle)
    nodes_span = world_size > gpus_per_node
    dp_bw = device.inter_bw if nodes_span else device.intra_bw
    tp_s = sum(v for k, v in comm.items() if k.startswith("tp/")) / device.intra_bw
    pp_s = sum(v for k, v in comm.items() if k.startswith("pp/")) / (device.inter_bw if nodes_span else device.intra_bw)
    # cp ranks sit within a node; the keys/values are gathered before attention can start (not hidden)
    cp_s = sum(v for k, v in comm.items() if k.startswith("cp/")) / device.intra_bw
    # expert parallelism's all-to-all sits between the router and the experts: nothing hides it
    ep_s = sum(v for k, v in comm.items() if k.startswith("ep/")) / dp_bw
    # a ring all-reduce puts twice its payload on the wire, all-gather / reduce-scatter about once
    dp_s = sum(v * (2 if k.endswith("all_reduce") else 1) for k, v in comm.items() if k.startswith("dp")) / dp_bw
    overlap = 0.0 if device.name == "cpu" else 2 / 3       # gradient traffic hides behind backward on a GPU
    column, row, _ = tp_linears(shapes)
    blocks_held = len({block_of(s.name) for s in shapes} - {None}) or 1
    per_block = {"column": len(column) // blocks_held, "row": len(row) // blocks_held} if column else None
    calls = collective_calls(layout, len(_unit_numels(shapes)), per_rank["params"], n_layers, per_block=per_block)
    latency = device.latency(world_size)
    tp_s += calls["tp"] * latency
    pp_s += calls["pp"] * latency
    dp_s += calls["dp"] * latency
    cp_s += calls["cp"] * latency
    exposed_dp = max(0.0, dp_s - overlap * compute_s)
    # offloaded states: gradients down and parameters up over PCIe, the optimizer step in host memory
    offload_s = per_rank["offloaded"] * (6 / 16) / device.pcie_bw + per_rank["offloaded"] * 2 / device.host_bw
    step_s = compute_s + optimizer_s + tp_s + pp_s + cp_s + exposed_dp + offload_s + ep_s
    tokens_per_sec = tokens_per_step / step_s
    mfu = flops_per_token * tokens_per_sec / (world_size * device.worker_peak(peak, world_size))
    return Plan(layout=layout, device=device.name, capacity_bytes=device.memory_bytes, per_rank_bytes=per_rank,
                comm_bytes_per_step=comm, bubble=idle, step_time_s=step_s, tokens_per_sec=tokens_per_sec,
                mfu=mfu, fits=fits,
                time_s={"compute": compute_s, "optimizer": optimizer_s, "tp": tp_s, "pp": pp_s, "cp": cp_s, "dp": exposed_dp,
                        "offload": offload_s, "ep": ep_s}, experts=expert_summary(cfg, shapes),
                step_time_from=step_time_from)
