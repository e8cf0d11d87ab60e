"""Issue 30's GPU checks: periodic background saves, trainer.deterministic, and what the switch costs.

    python benchmarks/gpu_determinism.py [--model llama_125m] [--seq-len 1024] [--speed-steps 24]

On one GPU, for parallel=single and parallel=fsdp (one rank):
1. async saves every 4 steps for 12 steps exit 0, and every checkpoint passes its manifest check
   and loads (a resume from it exits 0);
2. with trainer.deterministic=true two identical 16-step runs give identical losses, and a run stopped
   at step 8 and resumed from its checkpoint gives the uninterrupted losses of steps 9-16 exactly;
3. tokens/s with trainer.deterministic=false vs true (median of the steps after the fourth).
Prints one line per check (PASS/FAIL) and a speed table; exits 1 if a check failed. Without a GPU it
says so and exits 0 (`--device cpu` runs the same checks on a CPU, to try the script itself).
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

LAYOUTS = {"single": ["parallel=single"], "fsdp": ["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=1"]}
QUIET = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]"]


def run(args: list[str], run_dir: Path) -> tuple[int, list[dict], str]:
    """Exit code, metrics records and the stderr tail of `python -m framework ARGS`."""
    proc = subprocess.run([sys.executable, "-m", "framework", *args, *QUIET, f"hydra.run.dir={run_dir}"],
                          cwd=REPO, capture_output=True, text=True)
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in open(metrics) if line.strip()] if metrics.exists() else []
    return proc.returncode, records, proc.stderr[-2000:]


def losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


class Checks:
    def __init__(self):
        self.failed = 0

    def report(self, name: str, ok: bool, why_not: str = "") -> None:
        self.failed += not ok
        print(f"PASS  {name}" if ok else f"FAIL  {name}: {why_not.strip()}", flush=True)


def periodic_async_saves(checks: Checks, common: list[str], layout: str, tmp: Path) -> None:
    from framework.checkpoint.manager import check_intact
    run_dir = tmp / f"async_{layout}"
    rc, _, err = run([*common, *LAYOUTS[layout], "trainer.max_steps=12", "checkpoint.enabled=true",
                      "checkpoint.async_save=true", "checkpoint.interval=4", "checkpoint.keep_last=3"], run_dir)
    checks.report(f"{layout}: async saves every 4 steps, 12 steps, exit 0", rc == 0, f"exit {rc} {err}" if rc else "")
    ckpts = sorted((run_dir / "checkpoints").glob("step_*")) if rc == 0 else []
    checks.report(f"{layout}: checkpoints at 4, 8, 12", [p.name[-2:] for p in ckpts] == ["04", "08", "12"],
                  str([p.name for p in ckpts]))
    for path in ckpts:
        try:
            check_intact(str(path))
            intact = ""
        except Exception as e:      # noqa: BLE001 - reported, not raised
            intact = str(e)
        step = int(path.name.split("_")[-1])                # load it and train one step past it
        rc, _, err = run([*common, *LAYOUTS[layout], "trainer.max_steps=13", f"trainer.stop_at_step={step + 1}",
                          "checkpoint.enabled=false", f"checkpoint.resume={path}"], tmp / f"load_{layout}_{path.name}")
        checks.report(f"{layout}: {path.name} intact and loads", not intact and rc == 0, intact or (err if rc else ""))


def deterministic_runs(checks: Checks, common: list[str], layout: str, tmp: Path) -> None:
    args = [*common, *LAYOUTS[layout], "trainer.max_steps=16", "trainer.deterministic=true"]
    first, second = (run([*args, "checkpoint.enabled=false"], tmp / f"det_{layout}_{i}") for i in (1, 2))
    a, b = losses(first[1]), losses(second[1])
    checks.report(f"{layout}: deterministic, two runs, identical losses", first[0] == second[0] == 0 and a == b
                  and len(a) == 16, _first_difference(a, b) or f"exit {first[0]}, {second[0]} {first[2] or second[2]}")
    stopped = tmp / f"det_{layout}_stopped"
    rc, _, err = run([*args, "checkpoint.enabled=true", "checkpoint.interval=8", "trainer.stop_at_step=8"], stopped)
    ckpt = stopped / "checkpoints" / "step_00000008"
    rc2, resumed, err2 = run([*args, "checkpoint.enabled=false", f"checkpoint.resume={ckpt}"],
                             tmp / f"det_{layout}_resumed")
    r = losses(resumed)
    tail = {s: v for s, v in a.items() if s > 8}
    checks.report(f"{layout}: deterministic, stopped at 8 and resumed, the uninterrupted losses exactly",
                  rc == rc2 == 0 and r == tail and len(r) == 8,
                  _first_difference(tail, r) or f"exit {rc}, {rc2} {err or err2}")


def _first_difference(a: dict, b: dict) -> str:
    for step in sorted(set(a) | set(b)):
        if a.get(step) != b.get(step):
            return f"step {step}: {a.get(step)!r} vs {b.get(step)!r}"
    return ""


def speed(common: list[str], steps: int, rounds: int, tmp: Path) -> None:
    print(f"{'layout':<8}{'deterministic':>14}{'tok/s':>12}{'ratio':>8}")
    for layout in LAYOUTS:
        rates: dict[bool, list[float]] = {False: [], True: []}
        for i in range(rounds):                                     # interleaved: drift hits both alike
            for on in (False, True):
                rc, records, err = run([*common, *LAYOUTS[layout], f"trainer.max_steps={steps}",
                                        "checkpoint.enabled=false", f"trainer.deterministic={str(on).lower()}"],
                                       tmp / f"speed_{layout}_{on}_{i}")
                if rc:
                    print(f"{layout}: deterministic={on} failed (exit {rc}) {err}")
                    return
                rates[on].append(statistics.median(r["tokens_per_sec"] for r in records[4:]))
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"{layout:<8}{'false':>14}{off:>12,.0f}\n{layout:<8}{'true':>14}{on:>12,.0f}{on / off:>8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="llama_125m")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--speed-steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    opts = ap.parse_args()
    import torch
    if opts.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure (run this on a GPU machine)")
        return 0
    precision = "bf16" if opts.device == "cuda" else "fp32"
    common = [f"device={opts.device}", f"model={opts.model}", "data=synthetic", f"data.seq_len={opts.seq_len}",
              f"precision={precision}", f"trainer.global_batch_size={opts.batch}", "seed=4"]
    checks = Checks()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for layout in LAYOUTS:
            periodic_async_saves(checks, common, layout, tmp)
            deterministic_runs(checks, common, layout, tmp)
        speed(common, opts.speed_steps, opts.rounds, tmp)
    print(f"{checks.failed} check(s) failed" if checks.failed else "all checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
