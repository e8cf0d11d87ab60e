"""A sequence too long for one process under a memory cap trains under context parallelism (cp=4).

Runs one training step of the same model and sequence as parallel=single and as parallel=3d with
parallel.cp=4 (4 CPU workers, gloo), polls every process of each job for its peak resident set size
(/proc VmHWM), and stops a job whose rank passes --cap-gb (0: none). Prints each rank's peak.
    python benchmarks/cp_long_sequence.py --seq-len 8192 --dim 512 --layers 8 --cap-gb 2.5
Not a test: it takes a minute or two on two cores. A cp=4 rank grows about half as much as the single
process, not a quarter (it also keeps every layer's gathered keys and values for backward), so a small
model or a short sequence shows little difference.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _peak_rss(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, peak RSS in bytes, command line) of a live process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["PPid"]), int(fields.get("VmHWM", "0 kB").split()[0]) * 1024, cmdline


def _job_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def run(args: list[str], cap: int) -> tuple[int | None, list[int]]:
    """(exit code, or None if stopped at the cap; each worker's peak RSS) of `python -m framework ARGS`.
    The workers: the job's own process under parallel=single, else the children of the fork server."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "framework", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: dict[int, tuple[int, int, str]] = {}
    stopped = False
    while proc.poll() is None:
        for pid in _job_pids(proc.pid):
            found = _peak_rss(pid)
            if found:
                seen[pid] = (found[0], max(found[1], seen.get(pid, (0, 0))[1]), found[2])
        if any(peak > cap for _, peak, _ in seen.values()):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stopped = True
            break
        time.sleep(0.1)
    servers = {pid for pid, (_, _, cmd) in seen.items() if "forkserver" in cmd}
    workers = sorted(pid for pid, (ppid, _, _) in seen.items() if ppid in servers) or [proc.pid]
    if proc.returncode and not stopped:
        print(proc.stderr.read()[-3000:], file=sys.stderr)
    return (None if stopped else proc.returncode), [seen[pid][1] for pid in workers if pid in seen]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--cap-gb", type=float, default=2.5)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    opts = parser.parse_args()
    cap = int(opts.cap_gb * 2**30) if opts.cap_gb > 0 else float("inf")     # 0: no cap, each job's own peak
    common = ["model=tiny", f"model.dim={opts.dim}", f"model.n_layers={opts.layers}", "model.n_heads=4",
              "model.n_kv_heads=4", f"model.max_seq_len={opts.seq_len}", f"data.seq_len={opts.seq_len}",
              "trainer.max_steps=1", "trainer.global_batch_size=1", "trainer.micro_batch_size=1",
              "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]",
              "checkpoint.enabled=false"]
    layouts = {"cp=1 (parallel=single)": ["parallel=single"],
               "cp=4 (parallel=3d)": ["parallel=3d", "parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=1",
                                      "parallel.cp=4"]}
    print(f"one step, llama dim {opts.dim} x {opts.layers} layers, seq_len {opts.seq_len}, cap {opts.cap_gb} GiB "
          f"of peak RSS per rank")
    for name, layout in layouts.items():
        with tempfile.TemporaryDirectory(prefix="fw-cp-") as run_dir:
            code, peaks = run([*common, *layout, f"hydra.run.dir={run_dir}"], cap)
        outcome = "stopped at the cap" if code is None else ("ran" if code == 0 else f"failed (exit {code})")
        if code is None:
            outcome += f" ({opts.cap_gb} GiB) before its step ended"
        ranks = ", ".join(f"{peak / 2**30:.2f}" for peak in peaks)
        print(f"{name}: {outcome}; peak RSS per worker (GiB): {ranks}")


if __name__ == "__main__":
    main()
