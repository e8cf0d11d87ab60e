"""Resident memory each rank adds while it builds its model, per layout, as a share of the full fp32 model.

    python benchmarks/startup_memory.py [--nproc 4] [--layouts ddp fsdp deepspeed3]

A sharded layout must never hold the whole model: fsdp builds on the meta device and materialises only
its shards; deepspeed zero=stage3 partitions each module as it is constructed (zero.Init). ddp holds a
full replica. Each rank resets its peak RSS (VmHWM, via /proc/self/clear_refs) just before the
strategy's setup and reads it twice: when the model is built (sharded, filled, wrapped) and when setup
(optimizer and engine included) is done. Also prints the first step's loss, the same in every layout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# ~98M parameters (vocab kept small so that no single tensor is a large share of the model).
MODEL = ["model=small", "model.dim=768", "model.n_layers=12", "model.n_heads=12", "model.n_kv_heads=12",
         "model.vocab_size=8192", "data=synthetic", "data.vocab_size=8192", "data.seq_len=32",
         "data.num_tokens=100000", "trainer.global_batch_size=8", "trainer.micro_batch_size=2",
         "checkpoint.enabled=false", "logging.trackers=[]"]
LAYOUTS = {
    "ddp": ["parallel=ddp"],
    "fsdp": ["parallel=fsdp", "zero=stage3"],
    "deepspeed3": ["parallel=deepspeed", "zero=stage3"],
}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def worker(overrides: list[str], out: str) -> None:
    """One rank under torchrun: set up the strategy as the trainer does, with the two peak readings."""
    sys.path.insert(0, str(REPO))
    import torch
    from hydra import compose, initialize_config_dir

    from framework.compose.config_store import register_configs
    from framework.models.factory import ModelFactory
    from framework.optim.factory import OptimizerFactory
    from framework.optim.schedulers import build_scheduler
    from framework.strategies.registry import strategy_runtime
    from framework.models.loss import cross_entropy
    from framework.train.trainer import Trainer

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    s = strategy_runtime(cfg.parallel.name)(cfg)
    s.setup_distributed()
    trainer = Trainer(cfg, s, tempfile.mkdtemp())
    readings = {}

    class Measured(ModelFactory):
        """Reads the peak once the model is built: after the last materialise, or when the full model returns."""
        def __call__(self):
            model = super().__call__()
            readings["built_kib"] = _rss_kib("VmHWM:")
            return model

        def materialize(self, module, device):
            super().materialize(module, device)
            readings["built_kib"] = _rss_kib("VmHWM:")

    factory = Measured(cfg)
    if cfg.parallel.name == "deepspeed":
        build = type(s)._build_model

        def measured_build(self, model_factory):
            model = build(self, model_factory)
            readings["built_kib"] = _rss_kib("VmHWM:")
            return model
        type(s)._build_model = measured_build
        import deepspeed   # the library's own code and buffers are not the model's: load them before the baseline
        deepspeed.init_distributed()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                   # reset VmHWM to the current RSS
    before = _rss_kib("VmRSS:")
    s.setup(factory, OptimizerFactory(cfg.optimizer), lambda opt: build_scheduler(opt, cfg.scheduler, 10))
    setup_peak = _rss_kib("VmHWM:")
    loss = float(s.forward_backward(trainer._local_micro_batches(trainer.train_data, 0), cross_entropy))
    full_bytes = factory.spec.num_params(cfg.model) * 4
    record = {"rank": s.rank, "full_model_mb": full_bytes / 2**20, "loss": loss,
              "build_added_mb": (readings["built_kib"] - before) / 1024,
              "setup_added_mb": (setup_peak - before) / 1024}
    with open(f"{out}.{s.rank}", "w") as f:
        json.dump(record, f)
    s.teardown()
    del torch


def run_layout(name: str, nproc: int) -> list[dict]:
    out = tempfile.mktemp(prefix=f"startup_{name}_")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           __file__, "--worker", out, "--", *MODEL, *LAYOUTS[name], f"launcher.nproc_per_node={nproc}"]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(nproc)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        worker([a for a in rest if a != "--"], args.worker)
        return
    print(f"{'layout':<11} {'full fp32 MB':>12} {'built: max MB/rank':>19} {'share':>6} "
          f"{'setup: max MB/rank':>19} {'share':>6}  first loss")
    for name in args.layouts:
        ranks = run_layout(name, args.nproc)
        full = ranks[0]["full_model_mb"]
        built = max(r["build_added_mb"] for r in ranks)
        setup = max(r["setup_added_mb"] for r in ranks)
        print(f"{name:<11} {full:>12.0f} {built:>19.0f} {built / full:>6.0%} {setup:>19.0f} {setup / full:>6.0%}  "
              f"{ranks[0]['loss']:.6f}")


if __name__ == "__main__":
    main()
