"""The kernels stage's measurements, each run in a process of its own and printed as JSON lines (one a row):

    python -m benchmarks.gpu.kernel_times [cp] [moe] [loss_chunk] [--device cuda|cpu] [--dry-run]

cp          one context-parallel rank's attention, forward and backward, as parallel.cp runs it
            (framework.parallel.context_parallel.chunked_causal_attention over the whole sequence's keys
            and values: what the all-gather hands each rank), on SDPA's flash and memory-efficient kernels
            (sdpa_kernel picks one; the profiler names what ran), for cp = 1 (the whole sequence, plain
            causal SDPA), 2, 4, 8 at 32,768 tokens with Llama 3 8B's heads (32 query, 8 KV, 128 wide), bf16.
            step_s is the slower of the first and last rank; x ideal = step_s / (cp=1's time / cp).
moe         the routed experts of Qwen3-30B-A3B (conf/model/qwen3_30b_a3b.yaml: 128 experts of 2048 -> 768,
            top 8) over 8,192 tokens, forward and backward, as one grouped GEMM per weight and as a loop over
            experts (framework.models.moe.experts.expert_swiglu), bf16; and how far their outputs differ.
loss_chunk  the peak memory of the llama3_8b loss (seq 8192, vocab 128,256, dim 4096) and its backward,
            whole and in chunks of 1,024 tokens (benchmarks/loss_chunk_memory.py).
Times are medians of 5 after 2 warm-ups, the device synchronised around each. --dry-run: tiny shapes, and a
CPU, where the memory-efficient kernel does not exist (its rows say so, with null times). A measurement that
raises prints a row with its error, and the next one runs.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import torch
import torch.nn.functional as F

WARMUPS, REPEATS = 2, 5
CP_DEGREES = {False: (1, 2, 4, 8), True: (1, 2)}       # by dry_run
BACKENDS = ("flash", "efficient")
MOE_COMPUTES = ("grouped_mm", "loop")


def row_names(dry_run: bool) -> list[str]:
    """The rows the measurements print, in order."""
    return [*(f"cp={cp} {backend}" for backend in BACKENDS for cp in CP_DEGREES[dry_run]),
            *(f"moe {compute}" for compute in MOE_COMPUTES), "loss chunks"]


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def timed(fn, device: str) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(WARMUPS):
        fn()
    times = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_names(fn, device: str) -> tuple[list[str], list[str]]:
    """(the attention ops, the device kernels) one call of fn ran, as the profiler names them."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    attention = re.compile(r"flash|fmha|efficient|attention", re.I)
    events = [e for e in prof.key_averages() if attention.search(e.key)]
    ops = sorted({e.key[len("aten::"):] for e in events if e.key.startswith("aten::")
                  and e.key != "aten::scaled_dot_product_attention"})
    kernels = sorted({e.key[:100] for e in events if e.device_type.name == "CUDA"})
    return ops, kernels[:8]


def cp_attention(device: str, dry_run: bool) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from framework.parallel.context_parallel import chunked_causal_attention, shard, shard_positions
    batch, heads, kv_heads, width, seq = (1, 4, 2, 16, 256) if dry_run else (1, 32, 8, 128, 32768)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq, width, device=device, dtype=dtype)
    grouped = [torch.randn(batch, kv_heads, seq, width, device=device, dtype=dtype) for _ in "kv"]
    # the same keys and values repeated to every query head: for a kernel that takes no grouped heads
    expanded = [t.repeat_interleave(heads // kv_heads, dim=1) for t in grouped]

    def rank_step(cp: int, rank: int, kv: list[torch.Tensor]):
        k, v = (t.detach().requires_grad_() for t in kv)
        gqa = k.shape[1] != heads
        if cp == 1:
            mine = q.detach().requires_grad_()
            attend = lambda: F.scaled_dot_product_attention(mine, k, v, is_causal=True, enable_gqa=gqa)   # noqa: E731
        else:
            mine = shard(q.detach(), cp, rank, dim=2).requires_grad_()
            positions = shard_positions(seq, cp, rank)
            attend = lambda: chunked_causal_attention(mine, k, v, positions, seq // (2 * cp), enable_gqa=gqa)  # noqa: E731
        grad = torch.randn_like(mine)

        def step():
            for t in (mine, k, v):
                t.grad = None
            attend().backward(grad)
        return step

    kernels_of = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    for backend in BACKENDS:
        kernel, whole = kernels_of[backend], None
        for cp in CP_DEGREES[dry_run]:
            ranks = (0,) if cp == 1 else (0, cp - 1)
            row = {"job": f"cp={cp} {backend}", "backend": backend, "cp": cp, "seq": seq, "heads": heads,
                   "kv_heads": kv_heads}
            failures = []
            for kv, note in ((grouped, None), (expanded, f"{kv_heads} KV heads repeated to {heads}")):
                try:
                    with sdpa_kernel(kernel):
                        per_rank = {str(r): timed(rank_step(cp, r, kv), device) for r in ranks}
                        ops, kernels = kernel_names(rank_step(cp, ranks[0], kv), device)
                    break
                except RuntimeError as e:
                    failures.append(str(e).splitlines()[0][:200])
            else:
                emit(**row, step_s=None, why=f"{backend} cannot run this here: {failures[-1]}")
                continue
            step_s = max(per_rank.values())
            whole = step_s if cp == 1 else whole
            emit(**row, step_s=step_s, rank_s=per_rank, over_ideal=step_s * cp / whole if whole else None,
                 ops=" + ".join(ops), kernels=kernels, why=f"{note}: grouped heads failed ({failures[0]})" if note else None)


def moe(device: str, dry_run: bool) -> None:
    from omegaconf import OmegaConf

    from framework.config.paths import CONFIG_DIR
    from framework.models.moe.experts import expert_swiglu
    from framework.models.moe.model import MoEArgs
    shape = OmegaConf.load(CONFIG_DIR / "model" / ("moe_tiny.yaml" if dry_run else "qwen3_30b_a3b.yaml"))
    dim, hidden, experts = shape.dim, shape.moe_ffn_dim, shape.n_experts
    top_k = shape.get("top_k", MoEArgs.top_k)
    tokens = 64 if dry_run else 4 * 2048
    dtype = torch.bfloat16 if device == "cuda" else torch.float32    # CUDA's grouped GEMM takes bf16 only
    torch.manual_seed(0)
    rows = tokens * top_k
    counts = torch.bincount(torch.randint(0, experts, (rows,)), minlength=experts).to(device)
    x = torch.randn(rows, dim, device=device, dtype=dtype, requires_grad=True)
    w1, w3 = (torch.randn(experts, hidden, dim, device=device, dtype=dtype).mul_(0.02).requires_grad_() for _ in "13")
    w2 = torch.randn(experts, dim, hidden, device=device, dtype=dtype).mul_(0.02).requires_grad_()
    grad = torch.randn(rows, dim, device=device, dtype=dtype)
    outputs, seconds = {}, {}
    for compute in MOE_COMPUTES:
        def step():
            for t in (x, w1, w2, w3):
                t.grad = None
            expert_swiglu(x, counts, w1, w3, w2, compute).backward(grad)
        row = {"job": f"moe {compute}", "compute": compute, "experts": experts, "top_k": top_k, "rows": rows}
        try:
            seconds[compute] = timed(step, device)
            with torch.no_grad():
                outputs[compute] = expert_swiglu(x, counts, w1, w3, w2, compute).float()
        except RuntimeError as e:
            emit(**row, step_s=None, why=f"{compute} cannot run here: {str(e).splitlines()[0][:200]}")
            continue
        extra = {}
        if compute == "loop" and "grouped_mm" in seconds:
            diff = (outputs["grouped_mm"] - outputs["loop"]).abs().max() / outputs["loop"].abs().max()
            extra = {"grouped_speedup": seconds["loop"] / seconds["grouped_mm"], "max_rel_diff": float(diff)}
        emit(**row, step_s=seconds[compute], **extra)


def loss_chunk(device: str, dry_run: bool) -> None:
    from benchmarks.loss_chunk_memory import peak_bytes
    seq, vocab, dim, chunk = (256, 1024, 64, 64) if dry_run else (8192, 128256, 4096, 1024)
    where = torch.device(device)
    whole, chunked = (peak_bytes(seq, vocab, dim, c, where) for c in (0, chunk))
    emit(job="loss chunks", seq=seq, vocab=vocab, dim=dim, chunk=chunk, whole_gib=whole / 2**30,
         chunked_gib=chunked / 2**30, whole_over_chunked=whole / chunked,
         measured_as="CUDA allocator peak" if device == "cuda" else "peak live tensor bytes (CPU dispatch count)")


MEASURES = {"cp": cp_attention, "moe": moe, "loss_chunk": loss_chunk}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measures", nargs="+", choices=list(MEASURES))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dry-run", action="store_true")
    opts = ap.parse_args()
    for name in opts.measures:
        try:
            MEASURES[name](opts.device, opts.dry_run)
        except Exception as e:      # noqa: BLE001 - a row says what broke; the next measurement runs
            emit(job=name, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        finally:
            if opts.device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
