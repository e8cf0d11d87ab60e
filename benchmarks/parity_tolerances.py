"""What each kind of parity really reaches: the tests' tiny jobs under every layout, precision and kernel
choice, each against its reference run by tests/harness/parity.py's parity_report (max relative difference of
the loss and grad norm over 8 steps, and of the final parameters). The numbers behind TOLERANCES.
    python benchmarks/parity_tolerances.py --out /tmp/parity [--only ddp,fsdp]
Finished runs in --out are reused; delete a run's dir to train it again.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.harness.helpers import DEEPSPEED_Z2, DEEPSPEED_Z3, FAST  # noqa: E402
from tests.harness.parity import parity_report  # noqa: E402

# FAST, saving a checkpoint at steps 4 and 8 (the resumes start from step 4)
BASE = [a for a in FAST if a != "checkpoint.enabled=false"] + ["checkpoint.interval=4"]
TP2, PP2 = ["parallel=3d", "parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=1"], \
    ["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=1"]

#: name -> (overrides, reference name, resumed from: (run name, step) or None)
RUNS = {
    "single": (["parallel=single"], None, None),
    "single_again": (["parallel=single"], "single", None),
    "single_resumed": (["parallel=single"], "single", ("single", 4)),
    "ddp": (["parallel=ddp"], "single", None),
    "ddp_z1": (["parallel=ddp", "zero=stage1"], "single", None),
    "ddp_resumed": (["parallel=ddp"], "ddp", ("ddp", 4)),
    "fsdp_z2": (["parallel=fsdp", "zero=stage2"], "single", None),
    "fsdp_z3": (["parallel=fsdp", "zero=stage3"], "single", None),
    "fsdp_z3_resumed": (["parallel=fsdp", "zero=stage3"], "fsdp_z3", ("fsdp_z3", 4)),
    "fsdp_z3_to_single": (["parallel=single"], "single", ("fsdp_z3", 4)),
    "hsdp_2x2": (["parallel=fsdp", "zero=stage3", "parallel.dp_replicate=2", "parallel.dp_shard=2"], "single", None),
    "fsdp_z3_x4": (["parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=4"], "single", None),
    "fsdp_offload": (["parallel=fsdp", "zero=stage3", "zero.offload_params=true"], "single", None),
    "3d_tp2": (TP2, "single", None),
    "3d_tp2_sp": ([*TP2, "parallel.sequence_parallel=true"], "single", None),
    "3d_pp2": ([*PP2, "parallel.pp_schedule=1F1B"], "single", None),
    "3d_2x2x2": (["parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=2", "zero=stage3"], "single",
                 None),
    "3d_tp2_resumed": (TP2, "3d_tp2", ("3d_tp2", 4)),
    "ds_z0": (["parallel=deepspeed", "zero=none"], "single", None),
    "ds_z1": (["parallel=deepspeed", "zero=stage1"], "single", None),
    "ds_z2": (list(DEEPSPEED_Z2), "single", None),
    "ds_z3": (list(DEEPSPEED_Z3), "single", None),
    "ds_z3_resumed": (list(DEEPSPEED_Z3), "ds_z3", ("ds_z3", 4)),
    "ds_offload": (["parallel=deepspeed", "zero=stage2", "zero.offload_optimizer=true"], "single", None),
    "ds_offload_cpu_adam": (["parallel=deepspeed", "zero=stage2", "zero.offload_optimizer=true",
                             "parallel.use_deepspeed_optimizer=true"], "single", None),
    "ddp_fp16_comm": (["parallel=ddp", "parallel.comm_hook=fp16"], "single", None),
    "compiled_single": (["parallel=single", "trainer.compile=true"], "single", None),
    "compiled_ddp": (["parallel=ddp", "trainer.compile=true"], "single", None),
    "compiled_3d_tp2": ([*TP2, "trainer.compile=true"], "single", None),
    "bf16_single": (["parallel=single", "precision=bf16"], "single", None),
    "bf16_fsdp_z2": (["parallel=fsdp", "zero=stage2", "precision=bf16"], "single", None),
    "bf16_3d_tp2_pp2": (["parallel=3d", "parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=1", "precision=bf16"],
                        "single", None),
    "bf16_3d_pp2_dp2": (["parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=2", "zero=stage3",
                         "precision=bf16"], "single", None),
    "bf16_ds_z2": (["parallel=deepspeed", "zero=stage2", "precision=bf16"], "single", None),
    "fp16_single": (["parallel=single", "precision=fp16"], "single", None),
    "fp16_ddp": (["parallel=ddp", "precision=fp16"], "single", None),
    "float8_single": (["parallel=single", "precision=float8", "precision.float8_emulate=true"], "single", None),
    "float8_fsdp": (["parallel=fsdp", "zero=stage3", "precision=float8", "precision.float8_emulate=true"], "single",
                    None),
}


def train(out: Path, name: str) -> Path:
    run_dir = out / name
    if (run_dir / "checkpoints" / "step_00000008" / "meta.json").exists():
        return run_dir
    args, _, resumed = RUNS[name]
    if resumed is not None:
        source = train(out, resumed[0]) / "checkpoints" / f"step_{resumed[1]:08d}"
        args = [*args, f"checkpoint.resume={source}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "framework", *BASE, *args, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--only", default="", help="comma-separated substrings of run names")
    args = parser.parse_args()
    wanted = [n for n in RUNS if RUNS[n][1] and (not args.only or any(s in n for s in args.only.split(",")))]
    print(f"{'run':<20} {'kind':<18} {'tolerance':>9} {'loss':>9} {'grad_norm':>9} {'params':>9} {'(its tol.)':>9}")
    for name in wanted:
        try:
            run_dir, reference = train(args.out, name), train(args.out, RUNS[name][1])
            r = parity_report(run_dir, reference)
        except (SystemExit, Exception) as e:      # one failed run or unreadable checkpoint: say so, go on
            print(f"{name:<20} failed: {str(e).strip().splitlines()[-1][:150]}", flush=True)
            continue
        params = "-" if r["params"] is None else f"{r['params']:.2g}"
        print(f"{name:<20} {r['kind']:<18} {r['tolerance']:>9.2g} {r['loss']:>9.2g} {r['grad_norm']:>9.2g} "
              f"{params:>9} {r['params_tolerance']:>9.2g}", flush=True)


if __name__ == "__main__":
    main()
