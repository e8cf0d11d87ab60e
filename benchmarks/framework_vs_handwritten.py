"""Throughput of `python -m framework` next to a hand-written loop of the same strategy, per strategy.

    python benchmarks/framework_vs_handwritten.py [--rounds 3] [--steps 30] [--warmup 5] [--model small]
        [--seq-len 128] [--batch 16] [--only single,ddp,...]

Strategies: single; ddp x2 (DistributedDataParallel); fsdp x2 (FSDP2 `fully_shard` per block + root,
zero=stage3); deepspeed x2 (`deepspeed.initialize`, ZeRO stage 2); tp2 (DTensor `parallelize_module`, the
colwise/rowwise plan of framework/models/llama/parallelize.py, no data parallelism).

Both sides train the same Llama (framework.models.llama, seeded by name with init_weights) on the same
sequences (the framework's GlobalBatchSampler over the pydoc corpus, train split), with the same global
batch, AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.1 on matrices only), warm-up + cosine LR, clipping at
1.0 and fp32. The hand-written loop is this file run with --worker: directly for single, under
`python -m torch.distributed.run --standalone --nproc-per-node 2` for the others. It uses the framework's
thread rule (framework/runtime/devices.py: one worker keeps torch's default, N workers on a node get
cores // N threads each) and, like the framework, takes the global-batch mean loss every step (one scalar
all-reduce on data-parallel layouts). The framework side is `python -m framework` with its metrics.jsonl.

Rounds interleave the two sides (framework first in even rounds, hand-written first in odd ones). Each
run's tokens/s = global batch x seq_len / median step time over the steps after --warmup. Per strategy the
table shows the median of each side over rounds, the ratio framework / hand-written (median of per-round
ratios; 1.0 = no overhead) and its spread (min-max over rounds), and both sides' loss at step 1 and at the
last step (step 1 is the initial weights on the first batch: equal means same model and same data).

Noise: on a CPU shared with other jobs, two runs of the same side can differ 2-4x in tokens/s (a process
with 2 OpenMP threads on 2 busy cores stalls whenever one thread is descheduled), so read the spread before
the ratio, use --omp-threads 1 there, and more rounds. The framework's step_time covers the whole
loop (data, forward, backward, optimizer step, and the work between its steps: metrics record, the
per-step preemption all-reduce), while the hand-written loop has no such work.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# name -> (framework overrides, workers)
STRATEGIES = {
    "single": (["parallel=single"], 1),
    "ddp": (["parallel=ddp"], 2),
    "fsdp": (["parallel=fsdp", "zero=stage3"], 2),
    "deepspeed": (["parallel=deepspeed", "zero=stage2"], 2),
    "tp": (["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1", "zero=none"], 2),
}
LABELS = {"single": "single", "ddp": "ddp x2", "fsdp": "fsdp x2 (zero3)", "deepspeed": "deepspeed x2 (z2)",
          "tp": "tp2"}
LR, BETAS, WEIGHT_DECAY, EPS, GRAD_CLIP, WARMUP_STEPS, MIN_LR_RATIO, SEED = 3e-3, (0.9, 0.95), 0.1, 1e-8, 1.0, 10, 0.1, 0


# ---- the hand-written side (one process of it) ------------------------------------------------
def worker(opts) -> None:
    strategy = opts.worker
    if strategy == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import yaml

    from framework.config.paths import CONFIG_DIR
    from framework.data.batches import GlobalBatchSampler, split_train_val
    from framework.data.sources import pydoc_corpus_bytes
    from framework.models.llama import Llama, init_weights

    # Same threads as the framework's workers: cores / workers on this node; one alone keeps torch's default.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if local_world > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_world))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")   # DeepSpeed on CPU joins this group, as under the framework

    model_cfg = yaml.safe_load((CONFIG_DIR / "model" / f"{opts.model}.yaml").read_text())
    model_cfg = {k: v for k, v in model_cfg.items() if k not in ("defaults", "_target_")}
    torch.manual_seed(SEED)
    model = Llama(**model_cfg)
    init_weights(model, seed=SEED)

    dp_rank, dp_size = rank, world
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    elif strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    elif strategy == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                "output": ColwiseParallel(output_layouts=Replicate())}
        for i in model.layers:
            plan.update({f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
            plan.update({f"layers.{i}.feed_forward.{w}": ColwiseParallel() for w in ("w1", "w3")})
            plan.update({f"layers.{i}.attention.wo": RowwiseParallel(),
                         f"layers.{i}.feed_forward.w2": RowwiseParallel()})
        parallelize_module(model, init_device_mesh("cpu", (world,)), plan)
        dp_rank, dp_size = 0, 1          # every tp rank sees the whole batch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)

    def lr_at(step: int) -> float:
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress = min(1.0, (step - WARMUP_STEPS) / max(1, opts.steps - WARMUP_STEPS))
        return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))

    def clip(parameters, max_norm: float) -> None:
        if strategy != "tp":
            torch.nn.utils.clip_grad_norm_(parameters, max_norm)
            return
        # torch's clip_grad_norm_ refuses a mix of DTensor (tp) and plain (norm weight) gradients: take
        # each layout's norm apart (a DTensor norm reduces its shards; the embedding's gradient comes back
        # Replicate, so summing every local shard's square over the group would count it twice).
        from torch.distributed.tensor import DTensor
        grads = [p.grad for p in parameters if p.grad is not None]
        layouts: dict = {}
        for g in grads:
            layouts.setdefault(tuple(g.placements) if isinstance(g, DTensor) else None, []).append(g)
        squares = torch.zeros(())
        for group in layouts.values():
            norm = torch.nn.utils.get_total_norm(group)
            squares += (norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2
        total = squares.sqrt()
        coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        for g in grads:
            g.mul_(coef)

    make_scheduler = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    engine = None
    if strategy == "deepspeed":
        import deepspeed
        from deepspeed.utils import logger as ds_logger
        ds_logger.setLevel("WARNING")
        config = {"train_batch_size": opts.batch, "train_micro_batch_size_per_gpu": opts.batch // world,
                  "gradient_accumulation_steps": 1, "gradient_clipping": GRAD_CLIP,
                  "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
                  "steps_per_print": 1 << 30}
        engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                               lr_scheduler=make_scheduler, config=config)
    else:
        scheduler = make_scheduler(optimizer)

    tokens, _ = split_train_val(np.frombuffer(pydoc_corpus_bytes(), dtype=np.uint8), 0.05)
    data = GlobalBatchSampler(tokens, opts.seq_len, opts.batch, seed=SEED)
    times, losses = [], []
    for step in range(opts.steps):
        start = time.perf_counter()
        seqs = data.local_batch(step, dp_rank, dp_size)
        inputs, targets = seqs[:, :-1], seqs[:, 1:]
        if engine is not None:
            loss = F.cross_entropy(engine(inputs).flatten(0, 1), targets.flatten())
            engine.backward(loss)
            engine.step()
        else:
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            clip(model.parameters(), GRAD_CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        mean = loss.detach()
        if dp_size > 1:                  # the global-batch mean loss, as the framework logs it
            mean = mean.clone()
            dist.all_reduce(mean)
            mean = mean / dp_size
        losses.append(float(mean))
        times.append(time.perf_counter() - start)
        if rank == 0:
            print(f"step {step + 1} time {times[-1]:.4f}s loss {losses[-1]:.6f}", flush=True)
    if rank == 0:
        print("RESULT " + json.dumps({"step_times": times, "losses": losses, "threads": torch.get_num_threads()}),
              flush=True)
    if engine is not None:
        engine.destroy()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def handwritten(strategy: str, opts) -> dict:
    workers = STRATEGIES[strategy][1]
    args = [__file__, "--worker", strategy, "--model", opts.model, "--seq-len", str(opts.seq_len),
            "--batch", str(opts.batch), "--steps", str(opts.steps)]
    cmd = [sys.executable, *args] if workers == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"hand-written {strategy} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def data_parallel_ranks(strategy: str) -> int:
    """tp2's two ranks see the same batch: the hand-written loop runs it whole, so must the framework
    (a micro-batch of batch // workers would make it accumulate two half batches)."""
    return 1 if strategy == "tp" else STRATEGIES[strategy][1]


def framework(strategy: str, opts) -> dict:
    from benchmarks.job_metrics import job_metrics
    records = job_metrics([*STRATEGIES[strategy][0], f"model={opts.model}", f"data.seq_len={opts.seq_len}",
                           f"trainer.global_batch_size={opts.batch}",
                           f"trainer.micro_batch_size={opts.batch // data_parallel_ranks(strategy)}",
                           f"seed={SEED}"], opts.steps)
    return {"step_times": [r["step_time"] for r in records], "losses": [r["loss"] for r in records]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--only", default=",".join(STRATEGIES), help="comma-separated: " + ",".join(STRATEGIES))
    parser.add_argument("--omp-threads", type=int, help="OMP_NUM_THREADS for both sides (torch's default threads "
                        "of a lone process, so it changes only single; workers get cores // workers either way)")
    parser.add_argument("--save", help="write every run's step times and losses here (JSON)")
    parser.add_argument("--worker", choices=list(STRATEGIES), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        return worker(opts)
    chosen = opts.only.split(",")
    if opts.omp_threads:
        os.environ["OMP_NUM_THREADS"] = str(opts.omp_threads)
    tokens = opts.batch * opts.seq_len
    rate = lambda run: tokens / statistics.median(run["step_times"][opts.warmup:])
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(opts.rounds):
        sides = ("framework", "hand") if r % 2 == 0 else ("hand", "framework")
        for strategy in chosen:
            for side in sides:
                run = (framework if side == "framework" else handwritten)(strategy, opts)
                runs.setdefault((strategy, side), []).append(run)
                print(f"round {r + 1} {LABELS[strategy]:<18} {side:<9} {rate(run):9.0f} tokens/s "
                      f"loss@1 {run['losses'][0]:.6f}" + (f" threads {run['threads']}" if "threads" in run else ""),
                      file=sys.stderr, flush=True)
                if opts.save:
                    Path(opts.save).write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in runs.items()}))
    print(f"model={opts.model} seq_len={opts.seq_len} global_batch={opts.batch} steps={opts.steps} "
          f"(median of steps {opts.warmup + 1}..{opts.steps}) rounds={opts.rounds}"
          + (f" OMP_NUM_THREADS={opts.omp_threads}" if opts.omp_threads else ""))
    print(f"{'strategy':<18}{'framework tok/s':>16}{'hand tok/s':>12}{'ratio':>7}{'spread':>14}"
          f"{'loss@1 fw':>11}{'loss@1 hand':>12}{'|diff|':>9}{'loss@last |diff|':>17}")
    for strategy in chosen:
        fw, hand = runs[(strategy, "framework")], runs[(strategy, "hand")]
        ratios = [rate(f) / rate(h) for f, h in zip(fw, hand)]
        l1f, l1h = fw[0]["losses"][0], hand[0]["losses"][0]
        last = max(abs(f["losses"][-1] - h["losses"][-1]) for f, h in zip(fw, hand))
        print(f"{LABELS[strategy]:<18}{statistics.median(map(rate, fw)):>16,.0f}{statistics.median(map(rate, hand)):>12,.0f}"
              f"{statistics.median(ratios):>7.3f}{f'{min(ratios):.3f}-{max(ratios):.3f}':>14}"
              f"{l1f:>11.6f}{l1h:>12.6f}{abs(l1f - l1h):>9.1e}{last:>17.1e}")


if __name__ == "__main__":
    main()
