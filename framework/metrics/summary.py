"""The lines rank 0 prints when a run ends: how it went, where it is, and what to type next."""
from __future__ import annotations

import json
import os
import shlex
import statistics

from framework.checkpoint.names import checkpoint_dir, complete_checkpoints
from framework.data.examples import COUNTS, PAIR_COUNTS, describe_cut
from framework.redact import redacted

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


def training_line(totals: dict) -> str:
    """tokens/s of all the loop's training steps together (LogInterval.totals() and the tokens they took),
    beside the parts of the loop that are not training steps, to compare with the records' median at a glance
    (they part where some intervals are slower: the first steps, profiled steps)."""
    rate = totals["tokens"] / max(totals["train_time"], 1e-9)
    return (f"  {rate:,.0f} tokens/s over all {totals['steps']} steps: {totals['train_time']:.2f} s training in a "
            f"{totals['loop_time']:.2f} s loop (eval {totals['eval_time']:.2f} s, "
            + (f"benchmarks {totals['tasks_time']:.2f} s, " if totals.get("tasks_time") else "")
            + f"saves {totals['save_time']:.2f} s, "
            f"compile {totals['compile_time']:.2f} s, profiler {totals['profile_time']:.2f} s)")


def run_summary(cfg, run_dir: str, wall_seconds: float, first_step: int, last_step: int,
                totals: dict) -> tuple[str, dict]:
    """(the lines printed, the values the trackers keep: final numbers, checkpoint, export command)."""
    records = _records(run_dir, first_step)
    losses = [r for r in records if "loss" in r]
    vals = [r for r in records if "val_loss" in r]
    values = {"steps": last_step - first_step, "last_step": last_step, "wall_seconds": round(wall_seconds, 1),
              "run_dir": os.path.abspath(run_dir)}
    lines = [f"done: {last_step - first_step} steps (to step {last_step} of {cfg.trainer.max_steps}) "
             f"in {wall_seconds:.1f} s"]
    if losses:
        values.update(loss=losses[-1]["loss"], tokens_per_sec=statistics.median(r["tokens_per_sec"] for r in losses),
                      mfu=statistics.median(r["mfu"] for r in losses))
        if vals:
            values["val_loss"] = vals[-1]["val_loss"]
        lines.append(f"  loss {losses[-1]['loss']:.4f}" + (f", val_loss {vals[-1]['val_loss']:.4f}" if vals else "")
                     + f", {values['tokens_per_sec']:,.0f} tokens/s"
                     + f", MFU {100 * values['mfu']:.2f}% (medians of logged steps)")
    if totals["steps"]:
        lines.append(training_line(totals))
    cut = {k: v for k, v in (records[0] if records else {}).items() if k in COUNTS + PAIR_COUNTS}
    if cut:
        values.update(cut)
        lines.append(f"  data        {describe_cut(cut, cfg.data.seq_len)}")
    lines.append(f"  run dir     {run_dir}")
    found = complete_checkpoints(checkpoint_dir(cfg, run_dir)) if cfg.checkpoint.enabled else []
    if found:
        ckpt = found[-1]
        rerun = shlex.join(["python", "-m", "framework", *_user_overrides(run_dir)])
        more = "" if last_step < cfg.trainer.max_steps else f" trainer.max_steps=<more than {last_step}>"
        export = os.path.join(run_dir, "hf")
        values.update(checkpoint=os.path.abspath(ckpt), export_path=os.path.abspath(export),
                      export_command=f"python -m framework.export {shlex.quote(ckpt)} {shlex.quote(export)}")
        lines += [f"  checkpoint  {ckpt}",
                  f"  resume:     {rerun} hydra.run.dir={shlex.quote(run_dir)} "
                  f"checkpoint.resume={shlex.quote(ckpt)}{more}",
                  f"  export:     {values['export_command']}"]
    if "tensorboard" in cfg.logging.trackers:
        lines.append(f"  tensorboard --logdir {shlex.quote(os.path.join(run_dir, 'tensorboard'))}")
    # the command line may carry credentials (a tracker's URL): neither the console nor a tracker gets them
    return redacted("\n".join(lines)), redacted(values)
