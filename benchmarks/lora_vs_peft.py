"""The framework's LoRA training step next to PEFT's on the same model, batch and width (issue 57).

    python benchmarks/lora_vs_peft.py [--rounds 5] [--steps 25] [--warmup 5] [--every 5] [--threads N] [--smoke]
                                      [-- overrides]

Four sides, each a training job in this process, interleaved round by round (the order rotates):
  framework LoRA  `python -m framework +recipe=lora_tiny <overrides>` as it runs: the config admitted, then
                  framework.train.worker.run_worker (the trainer, the single strategy, its metrics records),
  PEFT            the same Llama with the same initial weights (framework.models.factory) under peft's
                  LoraConfig of the same rank, alpha, dropout and linears, lora_A as the framework seeds it,
                  trained by a plain loop: forward, F.cross_entropy over the trained targets, backward,
                  clip_grad_norm_ at trainer.grad_clip, torch's AdamW with the job's settings and LR schedule,
  framework full  the same job with lora.enabled=false (every weight trained),
  plain full      the plain loop on that model without adapters.
Every side trains on the framework's batches (its sampler over the recipe's chats: rows of data.seq_len
tokens, examples packed whole), one micro-batch a step: the same sequences, so the same width. The two LoRA
sides' losses are compared step by step: the same model, batches and update give the same losses up to
float rounding, and the script stops if they part.

A side's step cost is its CPU time (time.process_time: every thread of the process) and its wall time per
step over the steps after --warmup, between two marks --every steps apart (the framework sides mark at their
metrics records, trainer.log_every=--every, so the trainer's own work between steps counts). Per side the
median over rounds and its spread (min-max); per pair the median of the per-round ratios and their spread.
The mark is framework LoRA / PEFT <= 1.05 in CPU time. On a CPU shared with other jobs use --threads 1: a
descheduled OpenMP thread leaves the others spinning, and a step's CPU time then grows several-fold.

--smoke: one round of 4 steps on 2 sequences (the test that keeps the script working); its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RECIPE = "+recipe=lora_tiny"
SIDES = ("framework LoRA", "PEFT", "framework full", "plain full")
PAIRS = (("framework LoRA", "PEFT"), ("framework full", "plain full"), ("framework LoRA", "framework full"),
         ("PEFT", "plain full"))
LOSS_RTOL = 1e-4        # float rounding over a few updates (both sides sum in different orders)


def configs(overrides: list[str]):
    """(the admitted LoRA job, the same job training every weight): what `python -m framework` trains."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from framework.config.paths import CONFIG_DIR
    from framework.config.schema import LoraConfig
    from framework.launch.admission import admit
    from framework.compose.config_store import register_configs
    register_configs()
    out = []
    for adapters in (True, False):
        with initialize_config_dir(str(CONFIG_DIR), version_base=None):
            cfg = compose("config", overrides=[*overrides, "logging.trackers=[]", "checkpoint.enabled=false",
                                               "trainer.eval_every=0", "trainer.progress_bar=false"])
        if not adapters:        # every lora key back to its default, as a job without adapters has them
            cfg.lora = OmegaConf.structured(LoraConfig(enabled=False))
        admit(cfg)
        out.append(cfg)
    return out


class Meter:
    """CPU and wall seconds a step between the mark at the end of the warm-up and the last mark."""

    def __init__(self, warmup: int):
        self.warmup, self.first, self.last = warmup, None, None

    def mark(self, step: int) -> None:
        now = (time.process_time(), time.perf_counter(), step)
        if step == self.warmup:
            self.first = now
        self.last = now

    def per_step(self) -> tuple[float, float]:
        steps = self.last[2] - self.first[2]
        return (self.last[0] - self.first[0]) / steps, (self.last[1] - self.first[1]) / steps


def framework_side(cfg, warmup: int):
    from framework.train.worker import run_worker
    meter, losses = Meter(warmup), {}

    def on_record(record: dict) -> None:
        meter.mark(record["step"])
        losses[record["step"]] = record["loss"]

    with tempfile.TemporaryDirectory() as run_dir, contextlib.redirect_stdout(io.StringIO()):   # its summary
        run_worker(cfg, run_dir, on_record)
    return meter.per_step(), losses


def plain_side(cfg, warmup: int, lora=None):
    """The plain loop on `cfg`'s model, with peft's adapters of `lora` (a lora config section) where given."""
    import torch
    import torch.nn.functional as F
    from framework.data.batches import build_samplers, micro_batches
    from framework.models.factory import ModelFactory
    from framework.models.loss import IGNORE_INDEX
    from framework.optim.schedulers import build_scheduler

    model = ModelFactory(cfg)()
    if lora is not None:
        model = with_peft_adapters(model, cfg, lora)
    model.train()
    t, o = cfg.trainer, cfg.optimizer
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    scheduler = build_scheduler(optimizer, cfg.scheduler, t.max_steps)
    sampler, _ = build_samplers(cfg.data, t.global_batch_size, cfg.seed, with_val=False)
    meter, losses = Meter(warmup), {}
    for step in range(1, t.max_steps + 1):
        (inputs, targets, *documents), = micro_batches(sampler.local_batch(step - 1, 0, 1), t.global_batch_size)
        logits = model(inputs, *documents)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if step % t.log_every == 0:
            losses[step] = loss.item()
            meter.mark(step)
    return meter.per_step(), losses


def with_peft_adapters(model, cfg, lora_cfg):
    """`model` under peft's LoRA on the linears the framework adapts, lora_A as the framework seeds it."""
    import peft
    import torch
    from framework.models import lora
    from framework.models.spec import spec_for
    spec = spec_for(cfg.model)
    names = lora.target_linears(model, spec.block_classes(model), lora_cfg.targets, spec.lora_skip())
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha,
                                                         lora_dropout=lora_cfg.dropout, use_dora=lora_cfg.dora,
                                                         target_modules=names))
    with torch.no_grad():
        for name in names:
            lora.init_adapter(f"{name}.lora_A", adapted.base_model.model.get_submodule(name).lora_A["default"].weight,
                              cfg.seed)
    return adapted


def compare_losses(ours: dict[int, float], theirs: dict[int, float]) -> float:
    """The largest relative difference of the two LoRA sides' losses; stops the script where they part."""
    worst = max(abs(ours[s] - theirs[s]) / abs(theirs[s]) for s in theirs)     # ours also logs step 1
    if worst > LOSS_RTOL:
        raise SystemExit(f"framework LoRA and PEFT train different numbers (losses {ours} and {theirs}): "
                         f"not the same job, so no comparison")
    return worst


def spread(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}-{format(max(values), fmt)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5, help="steps before the measured ones (a multiple of --every)")
    ap.add_argument("--every", type=int, default=5, help="steps between two marks")
    ap.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default); 1 on a shared "
                    "machine, where a descheduled thread makes the others spin and CPU time mean little")
    ap.add_argument("--smoke", action="store_true", help="one round of 4 steps on 2 sequences: does it run")
    ap.add_argument("overrides", nargs="*", help=f"the job (after --; {RECIPE} comes first)")
    opts = ap.parse_args()
    if opts.smoke:
        opts.rounds, opts.steps, opts.warmup, opts.every = 1, 4, 2, 2
        opts.overrides = [*opts.overrides, "trainer.global_batch_size=2"]
    if opts.warmup < opts.every or opts.warmup % opts.every or opts.steps <= opts.warmup:
        ap.error("--warmup must be a multiple of --every, and --steps more than --warmup")
    import torch
    if opts.threads:
        torch.set_num_threads(opts.threads)
    lora_cfg, full_cfg = configs([RECIPE, *opts.overrides, f"trainer.max_steps={opts.steps}",
                                  f"trainer.log_every={opts.every}"])
    run = {"framework LoRA": lambda: framework_side(lora_cfg, opts.warmup),
           "PEFT": lambda: plain_side(full_cfg, opts.warmup, lora_cfg.lora),
           "framework full": lambda: framework_side(full_cfg, opts.warmup),
           "plain full": lambda: plain_side(full_cfg, opts.warmup)}
    cpu = {side: [] for side in SIDES}
    wall = {side: [] for side in SIDES}
    worst = 0.0
    for r in range(opts.rounds):
        order = SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]
        losses = {}
        for side in order:
            (c, w), losses[side] = run[side]()
            cpu[side].append(c)
            wall[side].append(w)
        worst = max(worst, compare_losses(losses["framework LoRA"], losses["PEFT"]))
        print(f"round {r + 1}: " + ", ".join(f"{s} {1e3 * cpu[s][-1]:.1f}" for s in SIDES) + " ms of CPU a step",
              file=sys.stderr, flush=True)
    d, lc = lora_cfg.data, lora_cfg.lora
    print(f"CPU, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
          f"{' '.join([RECIPE, *opts.overrides])}: batch {lora_cfg.trainer.global_batch_size} x {d.seq_len} tokens, "
          f"LoRA rank {lc.rank} alpha {lc.alpha} on {', '.join(lc.targets) or 'every block linear'}; steps {opts.warmup + 1}-{opts.steps} of {opts.steps}, {opts.rounds} rounds; "
          f"LoRA losses equal to {worst:.1e} (relative)")
    print(f"{'side':<16}{'CPU ms/step':>12}{'spread':>14}{'wall ms/step':>14}{'spread':>14}")
    for side in SIDES:
        print(f"{side:<16}{1e3 * statistics.median(cpu[side]):>12.1f}{spread([1e3 * v for v in cpu[side]], '.1f'):>14}"
              f"{1e3 * statistics.median(wall[side]):>14.1f}{spread([1e3 * v for v in wall[side]], '.1f'):>14}")
    print(f"{'ratio':<34}{'CPU':>7}{'spread':>14}{'wall':>7}{'spread':>14}")
    for a, b in PAIRS:
        rc = [x / y for x, y in zip(cpu[a], cpu[b])]
        rw = [x / y for x, y in zip(wall[a], wall[b])]
        print(f"{a + ' / ' + b:<34}{statistics.median(rc):>7.3f}{spread(rc, '.3f'):>14}"
              f"{statistics.median(rw):>7.3f}{spread(rw, '.3f'):>14}")


if __name__ == "__main__":
    main()
