"""Bytes each rank hands to collectives per optimizer step, keyed "<mesh dim>/<collective>".

Payload: the whole tensor a collective works on (an all-reduce's or broadcast's tensor, an all-gather's
output, a reduce-scatter's input, each tensor sent or received), the quantity a wrapper around
torch.distributed counts (tests/fixtures/counters; tests/harness/helpers.assert_planned_comm compares each key
with real jobs); the wire traffic of a ring is 2(n-1)/n of an all-reduce's payload and (n-1)/n of the
others'.

Tensor parallelism is counted per collective DTensor issues for the model's plan, read off the rank's
parameter shapes: per micro-batch and block, each row-parallel linear reduces its output in forward
(all-reduce; sequence-parallel: a reduce-scatter, and an all-gather opens its region), and each
column-parallel linear's replicated input gets its gradient all-reduced in backward (q, k and v each
their own); the backward of a sequence-parallel reduce-scatter is an all-gather. The vocabulary-
sharded embedding and head add one such reduction each (an all-reduce, or with sequence parallelism
a reduce-scatter and an all-gather) and the head gathers the logits.

Context parallelism (cp) adds FSDP2's sharding over dp_shard x cp ("dp_shard_cp/") and, per block and
forward, an all-gather of the keys and of the values of the whole sequence ("cp/all_gather": each
rank's output is the sequence's), whose backward reduces the gradients of the same size
("cp/reduce_scatter"); tensor- and pipeline-parallel traffic carries a rank's seq_len / cp tokens.
"""
from __future__ import annotations

from framework.plan.layout import Layout
from framework.plan.shapes import ParamShape

REDUCE_BYTES = 4        # gradients are reduced in fp32 unless a policy says otherwise


def _gathered_bytes(layout: Layout, shapes: list[ParamShape], gather_bytes: int) -> int:
    """FSDP2's all-gather bytes a step. The root unit (what no block holds) stays gathered from its forward to
    its backward (framework/parallel/fsdp.py), so it is gathered as ZeRO-2 gathers. float8 (tensorwise)
    sends the blocks' 2-D linear weights at one byte a parameter (framework/parallel/float8.py converts
    those whose dims divide by 16)."""
    block_gathers, _ = fsdp_passes(layout)
    root_gathers = root_fsdp_gathers(layout)

    def nbytes(s: ParamShape) -> int:
        in_block = block_of(s.name) is not None
        float8 = layout.float8_gather and in_block and len(s.full) == 2 and all(d % 16 == 0 for d in s.full)
        return (block_gathers if in_block else root_gathers) * s.tp_numel * (1 if float8 else gather_bytes)
    # expert-parallel experts are left out of FSDP
    return sum(nbytes(s) for s in shapes if not (s.expert and layout.ep > 1))


def comm_bytes(layout: Layout, shapes: list[ParamShape], hidden: int, vocab: int, n_layers: int,
               reduce_bytes: int = REDUCE_BYTES, last_stage: bool = True, kv_dim: int = 0) -> dict[str, int]:
    """SHAPES: the parameters of one rank (its pipeline stages); LAST_STAGE: it holds the head;
    KV_DIM: the width of the keys (= of the values), all heads."""
    out: dict[str, int] = {}
    # this rank's tp shard of its stages, unsharded by dp (expert-parallel experts are never data-parallel)
    tp_local = sum(s.tp_numel for s in shapes if not (s.expert and layout.ep > 1))
    mb, act = layout.accumulation, layout.compute_bytes
    gather_bytes = 4 if layout.precision == "fp32" else 2
    if layout.dp * layout.cp > 1:
        sharding, shards = layout.sharding, layout.shards
        if sharding == "replicate":
            # DDP's all-reduce; ZeroRedundancyOptimizer broadcasts each parameter from the rank that steps it
            out["dp/all_reduce"] = tp_local * reduce_bytes
            if "optimizer" in shards:
                out["dp/broadcast"] = tp_local * 4
        elif sharding == "flat":
            # DeepSpeed ZeRO reduces in the compute precision; stage 3 gathers for forward and backward
            if "params" in shards:
                out["dp/all_gather"] = 2 * mb * tp_local * act
                out["dp/reduce_scatter"] = mb * tp_local * act
            elif shards:
                out["dp/reduce_scatter"] = mb * tp_local * act
                out["dp/all_gather"] = tp_local * act
            else:
                out["dp/all_reduce"] = tp_local * act
        elif sharding == "unit" and layout.shard_ranks > 1:
            _, syncs = fsdp_passes(layout)
            shard = "dp_shard_cp" if layout.cp > 1 else "dp_shard"
            out[f"{shard}/all_gather"] = _gathered_bytes(layout, shapes, gather_bytes)
            out[f"{shard}/reduce_scatter"] = syncs * tp_local * reduce_bytes
            if layout.dp_replicate > 1:
                out["dp_replicate/all_reduce"] = syncs * (tp_local // layout.shard_ranks) * reduce_bytes
        else:
            out["dp_replicate/all_reduce"] = tp_local * reduce_bytes
    tokens = layout.micro_batch * layout.local_seq_len
    if layout.cp > 1:
        out.update(context_parallel_bytes(layout, shapes, kv_dim))
    if layout.tp > 1:
        _tensor_parallel(out, layout, shapes, tokens, vocab, last_stage, reduce_bytes)
    if layout.pp > 1:
        boundary = tokens * hidden * act // (layout.tp if layout.sequence_parallel else 1)
        out["pp/send_recv"] = 2 * layout.pp_microbatches * layout.virtual_stages * boundary
    return out


def context_parallel_bytes(layout: Layout, shapes: list[ParamShape], kv_dim: int) -> dict[str, int]:
    """Keys and values of the whole sequence gathered per block and forward (recomputation gathers
    again), their gradients reduced once per backward."""
    blocks = len({block_of(s.name) for s in shapes} - {None})
    forwards = layout.accumulation * (2 if layout.ac != "none" else 1)
    per_block = 2 * layout.micro_batch * layout.seq_len * (kv_dim // layout.tp) * layout.compute_bytes
    return {"cp/all_gather": forwards * blocks * per_block,
            "cp/reduce_scatter": layout.accumulation * blocks * per_block}


def fsdp_passes(layout: Layout) -> tuple[int, int]:
    """(all-gathers, gradient reduce-scatters) of each FSDP2 unit per step. Gradient accumulation
    gathers and reduces every micro-batch (ZeRO-3 gathers again for backward). A pipeline stage syncs
    gradients once, at its last backward, and keeps parameters unsharded between backwards: ZeRO-2
    gathers once, ZeRO-3 once per forward (it reshards after each) and once for the first backward."""
    mb = layout.accumulation
    if layout.pp > 1:
        return (mb + 1 if layout.zero == 3 else 1), 1
    # parallel=fsdp reduces every micro-batch; parallel=3d turns gradient sync off but for the last one
    return (2 if layout.zero == 3 else 1) * mb, mb if layout.reduces_every_micro_batch else 1


def root_fsdp_gathers(layout: Layout) -> int:
    """All-gathers of the root FSDP2 unit a step: it does not reshard after forward, whatever the stage."""
    return 1 if layout.pp > 1 else layout.accumulation


def block_of(name: str) -> str | None:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else None


def tp_linears(shapes: list[ParamShape]) -> tuple[list[int], list[int], list[int]]:
    """Per block of this rank: input widths of its column-parallel linears and output widths of its
    row-parallel ones (dims of the whole weights), and the widths of its vocabulary-sharded embedding /
    head (outside blocks)."""
    column, row, vocab_sharded = [], [], []
    for s in shapes:
        if len(s.full) != 2 or s.tp_local == s.full or not s.name.endswith("weight"):
            continue
        if block_of(s.name) is None:
            vocab_sharded.append(s.full[1])
        elif s.tp_local[0] < s.full[0]:
            column.append(s.full[1])
        else:
            row.append(s.full[0])
    return column, row, vocab_sharded


def _last_rows(shapes: list[ParamShape]) -> int:
    """Sum over blocks of the output width of each block's last row-parallel linear."""
    last: dict[str, int] = {}
    for s in shapes:
        block = block_of(s.name)
        if block and len(s.full) == 2 and s.name.endswith("weight") and s.tp_local[1] < s.full[1]:
            last[block] = s.full[0]
    return sum(last.values())


def _tensor_parallel(out: dict, layout: Layout, shapes: list[ParamShape], tokens: int, vocab: int,
                     last_stage: bool, reduce_bytes: int) -> None:
    act, mb = layout.compute_bytes, layout.accumulation
    # Recompute repeats a block's forward collectives, except its last row-parallel reduction: checkpointing
    # stops early, once the last tensor backward needs is made again, and that output feeds only a residual add.
    recompute = mb if layout.ac != "none" else 0
    column, row, vocab_sharded = tp_linears(shapes)
    rows = sum(row) * tokens * act                          # one block-stack pass of row-parallel outputs
    rows_again = rows - _last_rows(shapes) * tokens * act
    columns = sum(column) * tokens * act
    ends = sum(vocab_sharded) * tokens * act
    logits = mb * tokens * vocab * act if last_stage and vocab_sharded else 0

    def add(key, nbytes):
        if nbytes:
            out[key] = out.get(key, 0) + int(nbytes)
    add("tp/all_reduce", mb * columns)
    if layout.sequence_parallel:
        add("tp/reduce_scatter", mb * rows + recompute * rows_again + mb * ends)
        add("tp/all_gather", (mb + recompute) * rows + mb * rows + mb * ends + logits)
        # replicated parameters of sequence-parallel regions (norms) get partial gradients, reduced per micro-batch
        whole = sum(s.tp_numel for s in shapes if s.tp_local == s.full)
        add("tp/all_reduce", mb * whole * reduce_bytes)
    else:
        add("tp/all_reduce", mb * rows + recompute * rows_again + mb * ends)
        add("tp/all_gather", logits)


def collective_calls(layout: Layout, units: int, param_bytes: int, n_layers: int,
                     bucket_bytes: int = 25 * 1024 * 1024, per_block: dict | None = None) -> dict[str, int]:
    """Collectives launched per step by mesh dimension: each pays a fixed latency, which dominates
    small messages (gloo on a CPU: milliseconds)."""
    mb = layout.accumulation
    per_block = per_block or {"column": 3 + 2, "row": 2}     # Llama's q, k, v, gate, up; out, down
    calls = {"tp": 0, "pp": 0, "dp": 0, "cp": 0}
    if layout.dp * layout.cp > 1:
        buckets = max(1, -(-param_bytes // bucket_bytes))
        sharding, shards = layout.sharding, layout.shards
        if sharding in ("replicate", "flat") and "params" not in shards:
            # bucketed reductions (every micro-batch or once a step), then a broadcast or all-gather of
            # what each rank stepped
            calls["dp"] = buckets * (mb if layout.reduces_every_micro_batch else 1) + (buckets if shards else 0)
        elif sharding == "flat":
            # stage 3: per unit and micro-batch, a gather for forward, one for backward, a reduce-scatter
            calls["dp"] = mb * units * 3
        elif sharding == "unit" and layout.shard_ranks > 1:
            gathers, syncs = fsdp_passes(layout)
            calls["dp"] = units * (gathers + syncs * (2 if layout.dp_replicate > 1 else 1)) \
                - (gathers - root_fsdp_gathers(layout))     # the root does not gather again for backward
        else:
            calls["dp"] = buckets
    layers = n_layers // layout.pp
    if layout.cp > 1:
        calls["cp"] = 2 * layers * mb * (3 if layout.ac != "none" else 2)
    if layout.tp > 1:
        forwards = mb * (2 if layout.ac != "none" else 1)
        column, row = per_block["column"], per_block["row"]
        if layout.sequence_parallel:      # all-gather + reduce-scatter per region forward, all-gather back
            calls["tp"] = layers * (2 * forwards * row + mb * (row + column)) + 2 * 2 * mb
        else:
            calls["tp"] = layers * (forwards * row + mb * column) + 2 * mb + mb
    if layout.pp > 1:
        calls["pp"] = 2 * layout.pp_microbatches * layout.virtual_stages
    return calls
