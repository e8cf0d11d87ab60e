"""Bytes each rank hands to collectives per optimizer step, by collective and mesh dimension.

Payload sizes (the tensor a rank passes in), the quantity a wrapper around torch.distributed counts;
the wire traffic of a ring is 2(n-1)/n of an all-reduce's payload and (n-1)/n of the others'.
"""
from __future__ import annotations

from framework.plan.layout import Layout
from framework.plan.shapes import ParamShape

REDUCE_BYTES = 4        # gradients are reduced in fp32 unless a policy says otherwise


def comm_bytes(layout: Layout, shapes: list[ParamShape], hidden: int, vocab: int, n_layers: int,
               reduce_bytes: int = REDUCE_BYTES) -> dict[str, int]:
    out: dict[str, int] = {}
    tp_local = sum(s.tp_numel for s in shapes)         # this rank's tp shard of its stages, unsharded by dp
    mb, act = layout.accumulation, layout.compute_bytes
    gather_bytes = 4 if layout.precision == "fp32" else 2
    if layout.dp > 1:
        if layout.strategy == "ddp":
            out["dp/all_reduce"] = tp_local * reduce_bytes
            if layout.zero == 1:
                out["dp/broadcast"] = tp_local * 4
        elif layout.strategy == "deepspeed":
            if layout.zero == 3:
                out["dp/all_gather"] = 2 * mb * tp_local * act
                out["dp/reduce_scatter"] = mb * tp_local * act
            elif layout.zero in (1, 2):
                out["dp/reduce_scatter"] = mb * tp_local * act
                out["dp/all_gather"] = tp_local * act
            else:
                out["dp/all_reduce"] = tp_local * act
        elif layout.dp_shard > 1:
            gathers = 2 if layout.zero == 3 else 1
            out["dp_shard/all_gather"] = gathers * mb * tp_local * gather_bytes
            out["dp_shard/reduce_scatter"] = mb * tp_local * reduce_bytes
            if layout.dp_replicate > 1:
                out["dp_replicate/all_reduce"] = mb * (tp_local // layout.dp_shard) * reduce_bytes
        else:
            out["dp_replicate/all_reduce"] = tp_local * reduce_bytes
    tokens = layout.micro_batch * layout.seq_len
    layers = n_layers // layout.pp
    forwards = layout.accumulation * (2 if layout.ac != "none" else 1)
    if layout.tp > 1:
        # two per block (attention, MLP) forward and two backward; recompute repeats the forward's
        per_block = tokens * hidden * act
        name = "tp/all_gather+reduce_scatter" if layout.sequence_parallel else "tp/all_reduce"
        out[name] = (forwards + layout.accumulation) * 2 * layers * per_block
        out["tp/logits_all_gather"] = layout.accumulation * tokens * vocab * 4
    if layout.pp > 1:
        boundary = tokens * hidden * act // (layout.tp if layout.sequence_parallel else 1)
        out["pp/send_recv"] = 2 * layout.pp_microbatches * layout.virtual_stages * boundary
    return out


def collective_calls(layout: Layout, units: int, param_bytes: int, n_layers: int,
                     bucket_bytes: int = 25 * 1024 * 1024) -> dict[str, int]:
    """Collectives launched per step by mesh dimension: each pays a fixed latency, which dominates
    small messages (gloo on a CPU: milliseconds)."""
    mb = layout.accumulation
    calls = {"tp": 0, "pp": 0, "dp": 0}
    if layout.dp > 1:
        buckets = max(1, -(-param_bytes // bucket_bytes))
        if layout.strategy in ("ddp", "deepspeed") and layout.zero < 3:
            calls["dp"] = buckets * (mb if layout.strategy == "deepspeed" else 1) + (buckets if layout.zero else 0)
        elif layout.strategy == "deepspeed" or layout.dp_shard > 1:
            gathers = 2 if layout.zero == 3 else 1
            calls["dp"] = mb * units * (gathers + 1 + (1 if layout.dp_replicate > 1 else 0))
        else:
            calls["dp"] = buckets
    layers = n_layers // layout.pp
    if layout.tp > 1:
        forwards = mb * (2 if layout.ac != "none" else 1)
        calls["tp"] = (forwards + mb) * 2 * layers * (2 if layout.sequence_parallel else 1) + 2 * mb
    if layout.pp > 1:
        calls["pp"] = 2 * layout.pp_microbatches * layout.virtual_stages
    return calls
