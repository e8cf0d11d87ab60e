"""Runs a plan: every job and the single-process reference of each, then a resume of chosen jobs from their
step-2 checkpoint, as one multirun, started (`start`) and waited for (`finish`) apart, so that the test
process can go on checking the plan meanwhile; returns where each ran."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from framework.checkpoint.names import step_dir_name
from framework.launch.preload import fork_server_preload
from framework.strategies.registry import strategy_class
from tests.matrix.cover import Plan
from tests.matrix.oracle import Oracle
from tests.matrix.run import Sweep, point_dir, start_sweep

#: every run saves its last step (BASE runs 3), whose parameters are compared; a job chosen to resume also
#: saves step RESUME_STEP, which it resumes from
SAVES = ("checkpoint.enabled=true",)
RESUME_STEP = 2
MID_RUN = (f"checkpoint.interval={RESUME_STEP}",)
RESUME_FROM = step_dir_name(RESUME_STEP)
#: what a reference keeps of its job: what is trained (the model) and in what arithmetic (the precision);
#: every other option is how, and must not change the result beyond its parity tolerance
REFERENCE_KEYS = ("model", "objective", "precision", "precision.float8_emulate", "precision.float8_recipe", "lora.enabled",
                  "lora.dora", "lora.base_dtype", "data.document_mask", "trainer.rampup_batch_size")


@dataclass
class Executed:
    runs: list[Path]                      # job i ran in runs[i]
    references: list[Path]                # its reference ran in references[i]
    resumed: dict[int, Path] = field(default_factory=dict)   # job i resumed from step 2 into resumed[i]
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def reference_of(job: dict) -> dict:
    return {k: v for k, v in job.items() if k in REFERENCE_KEYS}


def resumed_jobs(plan: Plan, oracle: Oracle) -> list[int]:
    """Jobs whose resumes hold every option value at least once (greedy: the job with most values not yet
    resumed per its cost first): each value is shown to resume exactly, at the cost of a few jobs, not all."""
    left = {item for job in plan.jobs for item in job.items()}
    chosen = []
    while left:
        best = max(range(len(plan.jobs)),
                   key=lambda i: (len(left & set(plan.jobs[i].items())) / oracle.cost(plan.jobs[i]), -i))
        if not left & set(plan.jobs[best].items()):
            break
        chosen.append(best)
        left -= set(plan.jobs[best].items())
    return sorted(chosen)


def sweep_preload(plan: Plan, oracle: Oracle) -> list[str]:
    """What the workers of every multi-process job import (framework/launch/preload.py), once: with their union
    as launcher.preload, the sweep's fork server starts once instead of again at each point that needs more
    (6 starts, ~5% of the sweep's CPU)."""
    modules = []
    for job in (j for j in plan.jobs if oracle.world(j) > 1):
        cfg = oracle.config(job)
        modules += fork_server_preload(strategy_class(cfg.parallel.name), cfg)
    return list(dict.fromkeys(modules))


@dataclass
class Started:
    """A plan whose sweep is running: where each job, reference and resume will have run."""
    plan: Plan
    sweep: Sweep
    executed: Executed
    at: float                             # when its preparation began (time.perf_counter)


def start(plan: Plan, oracle: Oracle, root: Path) -> Started:
    """Start training every job of `plan`, its references and its resumes, as one multirun under `root`."""
    started = time.perf_counter()
    references, index_of, reference_index = [], {}, []   # job i's reference is references[reference_index[i]]
    for job in plan.jobs:
        ref = reference_of(job)
        assert oracle.verdict(ref) is None, f"the reference {ref} of {job} is refused: {oracle.verdict(ref)}"
        composed = oracle.composed(ref)       # one run per config, however the job spelled it
        if composed not in index_of:
            index_of[composed] = len(references)
            references.append(ref)
        reference_index.append(index_of[composed])
    chosen = resumed_jobs(plan, oracle)
    job_dir = {i: point_dir(root, len(references) + i) for i in range(len(plan.jobs))}   # after the references
    every_run = [*SAVES, f"launcher.preload=[{','.join(sweep_preload(plan, oracle))}]"]
    commands = [oracle.overrides(r) + every_run for r in references] + \
               [oracle.overrides(j) + every_run + (list(MID_RUN) if i in chosen else [])
                for i, j in enumerate(plan.jobs)] + \
               [oracle.overrides(plan.jobs[i]) + every_run + list(MID_RUN) +
                [f"checkpoint.resume={job_dir[i] / 'checkpoints' / RESUME_FROM}"] for i in chosen]
    # one sweep: a resume runs after the job whose checkpoint it reads (Hydra runs the points in order)
    sweep = start_sweep(commands, root)
    ref_dirs = sweep.dirs[:len(references)]
    executed = Executed(runs=list(job_dir.values()), references=[ref_dirs[i] for i in reference_index],
                        resumed=dict(zip(chosen, sweep.dirs[len(references) + len(plan.jobs):])))
    return Started(plan, sweep, executed, started)


def finish(started: Started, timeout: float = 1800) -> Executed:
    """Wait for a started plan's sweep; what it trained (seconds: from its start, its preparation included)."""
    code = started.sweep.wait(timeout)
    executed = started.executed
    failures = [f"{d}: no metrics.jsonl" for d in started.sweep.dirs if not (d / "metrics.jsonl").exists()]
    if code != 0 or failures:
        executed.failures = failures + [f"the sweep exited {code}", started.sweep.output()[-6000:]]
    executed.seconds = time.perf_counter() - started.at
    return executed


def execute(plan: Plan, oracle: Oracle, root: Path, timeout: float = 1800) -> Executed:
    return finish(start(plan, oracle, root), timeout)
