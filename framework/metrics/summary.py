"""The lines rank 0 prints when a run ends: how it went, where it is, and what to type next."""
from __future__ import annotations

import json
import os
import shlex
import statistics

from framework.checkpoint.manager import checkpoint_dir, complete_checkpoints

# Overrides that the printed commands set themselves.
_REPLACED = ("checkpoint.resume=", "hydra.run.dir=", "trainer.max_steps=", "trainer.stop_at_step=")


def _records(run_dir: str, after_step: int) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r["step"] > after_step]


def _user_overrides(run_dir: str) -> list[str]:
    """The command line of this run, from Hydra's record in the run dir (absent for spawned-only runs)."""
    path = os.path.join(run_dir, ".hydra", "overrides.yaml")
    if not os.path.exists(path):
        return []
    import yaml
    with open(path) as f:
        return [o for o in yaml.safe_load(f) or [] if not o.startswith(_REPLACED)]


def training_line(totals: dict, tokens_per_step: int) -> str:
    """tokens/s of all the loop's training steps together (LogInterval.totals()), beside the parts of
    the loop that are not training steps, to compare with the records' median at a glance (they part
    where some intervals are slower: the first steps, profiled steps)."""
    rate = tokens_per_step * totals["steps"] / max(totals["train_time"], 1e-9)
    return (f"  {rate:,.0f} tokens/s over all {totals['steps']} steps: {totals['train_time']:.2f} s training in a "
            f"{totals['loop_time']:.2f} s loop (eval {totals['eval_time']:.2f} s, saves {totals['save_time']:.2f} s, "
            f"compile {totals['compile_time']:.2f} s, profiler {totals['profile_time']:.2f} s)")


def run_summary(cfg, run_dir: str, wall_seconds: float, first_step: int, last_step: int, totals: dict) -> str:
    records = _records(run_dir, first_step)
    losses = [r for r in records if "loss" in r]
    vals = [r for r in records if "val_loss" in r]
    lines = [f"done: {last_step - first_step} steps (to step {last_step} of {cfg.trainer.max_steps}) "
             f"in {wall_seconds:.1f} s"]
    if losses:
        lines.append(f"  loss {losses[-1]['loss']:.4f}" + (f", val_loss {vals[-1]['val_loss']:.4f}" if vals else "")
                     + f", {statistics.median(r['tokens_per_sec'] for r in losses):,.0f} tokens/s"
                     + f", MFU {100 * statistics.median(r['mfu'] for r in losses):.2f}% (medians of logged steps)")
    if totals["steps"]:
        lines.append(training_line(totals, cfg.trainer.global_batch_size * cfg.data.seq_len))
    lines.append(f"  run dir     {run_dir}")
    found = complete_checkpoints(checkpoint_dir(cfg, run_dir)) if cfg.checkpoint.enabled else []
    if found:
        ckpt = found[-1]
        rerun = shlex.join(["python", "-m", "framework", *_user_overrides(run_dir)])
        more = "" if last_step < cfg.trainer.max_steps else f" trainer.max_steps=<more than {last_step}>"
        lines += [f"  checkpoint  {ckpt}",
                  f"  resume:     {rerun} hydra.run.dir={shlex.quote(run_dir)} "
                  f"checkpoint.resume={shlex.quote(ckpt)}{more}",
                  f"  export:     python -m framework.export {shlex.quote(ckpt)} "
                  f"{shlex.quote(os.path.join(run_dir, 'hf'))}"]
    if cfg.logging.tensorboard:
        lines.append(f"  tensorboard --logdir {shlex.quote(os.path.join(run_dir, 'tensorboard'))}")
    return "\n".join(lines)
