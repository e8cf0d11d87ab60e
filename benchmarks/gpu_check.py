"""Do the step time, tokens/s and MFU the framework reports match the GPU? Every strategy, against a trace.

    python benchmarks/gpu_check.py [--steps 25] [--log-every 5] [--profile 16,20] [--rounds 1]
                                   [--only single,ddp,fsdp_z2,fsdp_z3,ds_z2,ds_z3] [--no-compile]
                                   [--batch-per-gpu 8] [-- model overrides ...]

On the visible GPUs it runs: single (one GPU); ddp, fsdp zero=stage2 and stage3, deepspeed zero=stage2
and stage3 on as many ranks as there are GPUs; each eager and with trainer.compile=true (not DeepSpeed,
which refuses it). The model is the 870M Llama of docs/benchmarks/h100.md (bf16, sequences of 2048, 8 sequences
per GPU) unless overrides after `--` replace it. Each job logs every --log-every steps (a step that does
not log is the case that used to be wrong) and records a torch.profiler trace of the steps --profile
names, which must be exactly one log interval. Per job it prints:
  reported  the step_time of the record that covers the profiled steps
  trace     the trace's time per step (rank 0): the device's period from the kernels each step launched,
            or, without GPU activity, the host's ProfilerStep# spans (framework/metrics/trace_steps.py)
  ratio     reported / trace; 0.97-1.03 is the mark
  tokens/s, MFU  medians of the records after the first two, the profiled interval left out
  memory    peak allocated / reserved GiB of those records (the highest)
  planned   `python -m framework.plan` of the same job on this GPU (its model timed there, issue 32), its step
            over the trace's, and its peak; --no-plan leaves it out
With --rounds > 1 the jobs are interleaved round by round (the order alternates) and each column is the
median over rounds; `spread` is the ratio's min-max. A job that fails (out of memory, a refusal) prints
its last error line and the rest go on. On a machine with no GPU it says so and runs nothing
(`--cpu N` runs the same jobs on N CPU processes instead: a dry run of this script, for tiny models).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from framework.metrics.trace_steps import trace_step_times  # noqa: E402

MODEL = ["model=llama_125m", "model.dim=2048", "model.n_layers=16", "model.n_heads=16", "model.n_kv_heads=8",
         "model.vocab_size=32000", "data=synthetic", "data.vocab_size=32000", "data.seq_len=2048", "precision=bf16"]
STRATEGIES = {   # name -> (overrides, uses every GPU, compiles)
    "single": (["parallel=single"], False, True),
    "ddp": (["parallel=ddp"], True, True),
    "fsdp_z2": (["parallel=fsdp", "zero=stage2"], True, True),
    "fsdp_z3": (["parallel=fsdp", "zero=stage3"], True, True),
    "ds_z2": (["parallel=deepspeed", "zero=stage2"], True, False),
    "ds_z3": (["parallel=deepspeed", "zero=stage3"], True, False),
}


def run_job(args: list[str], first: int, last: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "framework", *args, f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
            return {"error": f"exit {proc.returncode}: {lines[-1] if lines else ''}"[:160]}
        records = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if line.strip()]
        trace = trace_step_times(str(run_dir / "profile" / "rank_0.pt.trace.json"))
    covering = [r for r in records if r["step"] == last]
    steady = [r for r in records if r["step"] > 2 and not first <= r["step"] <= last]
    if not covering or not steady:
        return {"error": f"no record at step {last} or none outside the profiled steps"}
    truth = trace["device"] if trace["device"] is not None else trace["host"]
    reported = covering[0]["step_time"]
    return {"reported": reported, "trace": truth, "ratio": reported / truth,
            "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in steady),
            "mfu": statistics.median(r["mfu"] for r in steady),
            "allocated": max(r["memory_gb"] for r in steady), "reserved": max(r["memory_reserved_gb"] for r in steady)}


def plan_job(args: list[str], timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "framework.plan", "--json", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"error": f"plan exit {proc.returncode}: {lines[-1] if lines else ''}"[:160]}
    plan = json.loads(proc.stdout)
    return {"step_s": plan["step_time_s"], "from": plan["step_time_from"],
            "gib": plan["per_rank_bytes"]["total"] / 1024 ** 3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--profile", default="16,20", help="first,last profiled step: one log interval")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", default=",".join(STRATEGIES))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--batch-per-gpu", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1200, help="seconds a job may take")
    ap.add_argument("--cpu", type=int, default=0, help="dry run on this many CPU processes")
    ap.add_argument("--no-plan", action="store_true", help="leave out the planner's columns")
    ap.add_argument("overrides", nargs="*", help="replace the model (after --)")
    opts = ap.parse_args()

    import torch
    if not opts.cpu and (not torch.cuda.is_available() or torch.cuda.device_count() == 0):
        print("no GPU visible (torch.cuda.is_available() is False): nothing to check here")
        return
    first, last = (int(x) for x in opts.profile.split(","))
    if (first - 1) % opts.log_every or last != first + opts.log_every - 1 or last >= opts.steps:
        ap.error(f"--profile {opts.profile} must be one log interval (k*{opts.log_every}+1 .. (k+1)*{opts.log_every}) "
                 f"before step {opts.steps}")
    gpus = opts.cpu or torch.cuda.device_count()
    device = "cpu" if opts.cpu else "cuda"
    model = opts.overrides or MODEL
    jobs = {}
    for name in opts.only.split(","):
        overrides, all_gpus, compiles = STRATEGIES[name]
        ranks = gpus if all_gpus else 1
        for compiled in (False, True) if compiles and not opts.no_compile else (False,):
            jobs[f"{name}{' compile' if compiled else ''} x{ranks}"] = [
                *model, *overrides, f"device={device}", f"launcher.nproc_per_node={ranks}",
                f"trainer.global_batch_size={opts.batch_per_gpu * ranks}", f"trainer.compile={str(compiled).lower()}",
                f"trainer.max_steps={opts.steps}", f"trainer.log_every={opts.log_every}", "trainer.eval_every=0",
                f"trainer.profile.steps=[{first},{last}]", "trainer.progress_bar=false", "logging.trackers=[]",
                "checkpoint.enabled=false", "planner.check=false"]
    results: dict[str, list[dict]] = {name: [] for name in jobs}
    plans = {} if opts.no_plan else {name: plan_job(args, opts.timeout) for name, args in jobs.items()}
    for r in range(opts.rounds):
        for name in (list(jobs) if r % 2 == 0 else list(reversed(jobs))):
            results[name].append(run_job(jobs[name], first, last, opts.timeout))
            got = results[name][-1]
            print(f"round {r + 1} {name}: " + (got.get("error") or f"ratio {got['ratio']:.3f}"), file=sys.stderr,
                  flush=True)

    print(f"{'CPU' if opts.cpu else torch.cuda.get_device_name(0)} x{gpus}, torch {torch.__version__}, {' '.join(model)}, "
          f"{opts.batch_per_gpu} sequences per GPU, log_every={opts.log_every}, trace of steps {first}-{last}, "
          f"rounds={opts.rounds}")
    print(f"{'job':<20}{'reported s':>11}{'trace s':>9}{'ratio':>7}{'spread':>13}{'tokens/s':>11}{'MFU':>7}"
          f"{'alloc GiB':>10}{'resv GiB':>10}" + ("" if opts.no_plan else f"  {'planned s':>9}{'/trace':>7}{'GiB':>6}  from"))
    for name, runs in results.items():
        ok = [run for run in runs if "error" not in run]
        if not ok:
            print(f"{name:<20}  {runs[-1]['error']}")
            continue
        med = {key: statistics.median(run[key] for run in ok) for key in ok[0]}
        ratios = [run["ratio"] for run in ok]
        print(f"{name:<20}{med['reported']:>11.4f}{med['trace']:>9.4f}{med['ratio']:>7.3f}"
              f"{f'{min(ratios):.3f}-{max(ratios):.3f}':>13}{med['tokens_per_sec']:>11,.0f}{100 * med['mfu']:>6.1f}%"
              f"{med['allocated']:>10.2f}{med['reserved']:>10.2f}" + _planned(plans.get(name), med['trace']))


def _planned(plan: dict | None, trace_s: float) -> str:
    if plan is None:
        return ""
    if "error" in plan:
        return f"  {plan['error']}"
    return f"  {plan['step_s']:>9.4f}{plan['step_s'] / trace_s:>7.3f}{plan['gib']:>6.1f}  {plan['from']}"


if __name__ == "__main__":
    main()
