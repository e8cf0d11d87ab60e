"""`parallel=single` next to the plainest loop that trains the same model on one device (issue 33).

    python benchmarks/plain_loop_vs_framework.py [--device cuda] [--rounds 3] [--steps 30] [--warmup 8]
                                                 [--batch 8] [--sync-every 1] [--no-compile] [-- model overrides ...]

The plain loop builds the framework's model from the same config (framework.models.spec), trains it on
random tokens with autocast in the job's precision, AdamW (fused on CUDA, foreach on CPU; lr 3e-4, betas
0.9/0.95, weight decay 0.1), clipping at 1.0 and one host sync (the loss) every --sync-every steps, and with
--compile each block compiled as trainer.compile compiles them. The framework side is `python -m framework
parallel=single data=synthetic` with the same overrides, one micro-batch a step and a record every
--sync-every steps (its loss read on the host as often as the loop reads its own). Each side runs in its own
process; rounds interleave them (the order alternates) and each run's tokens/s is batch x seq_len over the
median step after --warmup (the loop's steps timed between two reads of its loss). `--plain` runs the loop
side alone and prints its tokens/s, step time and MFU as one JSON line (the GPU session's honest stage).
Per mode (eager, compiled) it prints both sides, framework / plain (median of the per-round ratios; the
mark is >= 1.00), its spread (min-max), and the MFU of each side where the device's peak is known.

The default model is the 870M Llama of docs/benchmarks/h100.md (dim 2048, 16 layers, bf16, 8 x 2048 tokens);
`--device cpu -- model=tiny data.seq_len=64` tries the script itself on a CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = ["model=llama_125m", "model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.n_kv_heads=8",
         "model.vocab_size=32000", "data.vocab_size=32000", "data.seq_len=2048", "precision=bf16"]


def _config(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from framework.config.paths import CONFIG_DIR
    from framework.compose.config_store import register_configs
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        return compose("config", overrides=["parallel=single", "data=synthetic", *overrides])


# ---- the plain side (one process) ----------------------------------------------------------------
def plain(opts) -> None:
    import torch
    from framework.metrics.mfu import mfu, peak_flops
    from framework.models.loss import cross_entropy
    from framework.models.spec import spec_for
    from framework.parallel.compile import compile_blocks
    from framework.parallel.precision import compute_dtype

    cfg = _config(opts.overrides)
    cfg.trainer.compile = opts.compile
    spec = spec_for(cfg.model)
    torch.manual_seed(0)
    with torch.device(opts.device):
        model = spec.build(cfg.model)
    compile_blocks(model, cfg, spec)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    cuda = opts.device.startswith("cuda")
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), **({"fused": True} if cuda else {"foreach": True}))
    seq, vocab = int(cfg.data.seq_len), int(cfg.model.get("vocab_size") or cfg.data.vocab_size)
    dtype = compute_dtype(cfg.precision.name)
    autocast = cfg.precision.name != "fp32"
    times = []              # seconds a step, each the mean over the steps between two reads of the loss
    start = time.perf_counter()
    for step in range(1, opts.steps + 1):
        tokens = torch.randint(0, vocab, (opts.batch, seq + 1), device=opts.device)
        with torch.autocast(torch.device(opts.device).type, dtype=dtype, enabled=autocast):
            loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % opts.sync_every == 0:
            loss.item()
            now = time.perf_counter()
            if step > opts.warmup:
                times.append((now - start) / opts.sync_every)
            start = now
    step_s = statistics.median(times)
    tokens_per_sec = opts.batch * seq / step_s
    flops = spec.flops_per_token(cfg.model, seq)
    peak = peak_flops(torch.device(opts.device), cfg.logging, cfg.precision)
    print(json.dumps({"tokens_per_sec": tokens_per_sec, "step_s": step_s, "mfu": mfu(flops, tokens_per_sec, peak, 1)}))


# ---- the framework side and the table ------------------------------------------------------------
def run_plain(opts, compiled: bool) -> float:
    cmd = [sys.executable, __file__, "--plain", "--device", opts.device, "--steps", str(opts.steps),
           "--warmup", str(opts.warmup), "--batch", str(opts.batch), "--sync-every", str(opts.sync_every),
           *(["--compile"] if compiled else []),
           "--", *opts.overrides]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=opts.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"plain loop exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_sec"]


def run_framework(opts, compiled: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "framework", "parallel=single", "data=synthetic", *opts.overrides,
               f"device={opts.device}", f"trainer.global_batch_size={opts.batch}",
               f"trainer.micro_batch_size={opts.batch}", f"trainer.compile={str(compiled).lower()}",
               f"trainer.max_steps={opts.steps}", f"trainer.log_every={opts.sync_every}", "trainer.eval_every=0",
               "trainer.progress_bar=false", "logging.trackers=[]", "checkpoint.enabled=false",
               "planner.check=false", f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=opts.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"framework exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
    steady = [r["tokens_per_sec"] for r in records if "tokens_per_sec" in r and r["step"] > opts.warmup]
    return statistics.median(steady)


def _mfu(opts, tokens_per_sec: float) -> str:
    import torch
    from framework.metrics.mfu import gpu_peak_flops, matmul_dtype
    from framework.models.spec import spec_for
    if not opts.device.startswith("cuda"):
        return "   -"
    cfg = _config(opts.overrides)
    peak = gpu_peak_flops(torch.cuda.get_device_name(0), matmul_dtype(cfg.precision))
    flops = spec_for(cfg.model).flops_per_token(cfg.model, int(cfg.data.seq_len))
    return f"{100 * flops * tokens_per_sec / peak:5.1f}%" if peak else "   -"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sync-every", type=int, default=1, help="steps between two reads of the loss (the plain side)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="the model and its data shape (after --)")
    opts = ap.parse_args()
    opts.overrides = opts.overrides or MODEL
    if opts.plain:
        plain(opts)
        return
    import torch
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        print("no GPU visible (torch.cuda.is_available() is False): nothing to measure here (--device cpu tries it)")
        return
    modes = [False] if opts.no_compile else [False, True]
    got = {(m, side): [] for m in modes for side in ("framework", "plain")}
    for r in range(opts.rounds):
        for compiled in modes:
            sides = ("framework", "plain") if r % 2 == 0 else ("plain", "framework")
            for side in sides:
                run = run_framework if side == "framework" else run_plain
                got[compiled, side].append(run(opts, compiled))
            print(f"round {r + 1} {'compiled' if compiled else 'eager'}: framework / plain "
                  f"{got[compiled, 'framework'][-1] / got[compiled, 'plain'][-1]:.3f}", file=sys.stderr, flush=True)
    name = torch.cuda.get_device_name(0) if opts.device.startswith("cuda") else "CPU"
    print(f"{name}, torch {torch.__version__}, {' '.join(opts.overrides)}, batch {opts.batch}, {opts.steps} steps "
          f"(median after {opts.warmup}), rounds={opts.rounds}")
    print(f"{'mode':<10}{'framework tok/s':>16}{'plain tok/s':>13}{'ratio':>7}{'spread':>13}{'MFU fw':>8}{'MFU plain':>10}")
    for compiled in modes:
        fw, pl = got[compiled, "framework"], got[compiled, "plain"]
        ratios = [f / p for f, p in zip(fw, pl)]
        print(f"{'compiled' if compiled else 'eager':<10}{statistics.median(fw):>16,.0f}{statistics.median(pl):>13,.0f}"
              f"{statistics.median(ratios):>7.3f}{f'{min(ratios):.3f}-{max(ratios):.3f}':>13}"
              f"{_mfu(opts, statistics.median(fw)):>8}{_mfu(opts, statistics.median(pl)):>10}")


if __name__ == "__main__":
    main()
