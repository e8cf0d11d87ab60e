"""The one parity check of a job against its reference run: per step the loss and the grad norm
(metrics.jsonl), and at the end every parameter of the two final checkpoints, each held to the tolerance
of the kind of difference between the two runs. Every layout test calls `assert_parity`; the kinds and
their tolerances are stated once, in TOLERANCES, with what they were measured at and why they differ.

The kind is read from the runs' resolved configs (config.yaml), never chosen by a test: a job whose
layout, precision and kernels are those of its reference (a resume, a restart, another launcher) is a
replay and held to "fp32"; a layout that sums in another order to "fp32-distributed"; reduced precision,
compiled kernels, compressed gradients to their own. A resumed run brings the config of the checkpoint it
started from: what trained its first steps counts too.

Measured on this project's CPU runs (model=tiny, 8 steps of FAST, lr 3e-3; tests/parity.py's
`parity_report`, max relative difference over loss / grad norm / final parameters against the
single-process fp32 run; "0" is bitwise):
    ddp x2, ddp zero1, fsdp zero2/3, hsdp 2x2, fsdp x4 ......... <= 1.1e-7 / 2.4e-7 / 1.2e-7
    3d tp2 / pp2 / 2x2x2, deepspeed zero 0-3 ................... <= 2.0e-7 / 4.2e-7 / 1.9e-7
    resume, restart, preemption of the same layout ............. 0 (any strategy)
    see TOLERANCES for the others.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

#: kind -> (relative tolerance, why runs of this kind differ from their reference by up to that much)
TOLERANCES: dict[str, tuple[float, str]] = {
    "fp32": (0.0, "a replay: the reference runs the same layout, precision and kernels in the same order "
                  "(a resume, a restart, another launcher of one layout); CPU kernels repeat bit for bit, "
                  "measured 0 for every strategy"),
    "fp32-distributed": (1e-5, "the same fp32 math summed in another order (over ranks, shards, tensor-parallel "
                               "splits, pipeline stages or micro-batches); measured <= 4.2e-7 (ddp, fsdp, "
                               "hsdp, 3d, deepspeed 0-3), held at 1e-5: a gradient sum instead of a mean is "
                               "a grad-norm error of ~1.0"),
    "fp32-implementation": (1e-5, "another implementation of the same fp32 model (transformers' modules, a "
                                  "plain training loop): other op orders; measured <= 1.2e-6"),
    "fp32-compiled": (1e-5, "torch.compile's fused kernels reassociate sums; measured <= 1.1e-6"),
    "offload": (1e-5, "DeepSpeed steps the offloaded fp32 states with torch's AdamW on the CPU; measured "
                      "<= 3.0e-7"),
    "fp16-comm": (5e-3, "gradients rounded to fp16 for the all-reduce (parallel.comm_hook=fp16): each "
                        "gradient has an fp16 rounding error of ~5e-4; measured <= 1.0e-3"),
    "bf16": (3e-2, "bf16 weights and activations (8 mantissa bits, 4e-3 rounding) against fp32; measured "
                   "loss <= 4e-3, grad norm <= 1.4e-2"),
    "fp16": (3e-2, "fp16 activations with a loss scale against fp32; measured <= 1e-2"),
    "float8-emulated": (5e-2, "the blocks' matmuls in emulated float8 (3 mantissa bits, tensorwise "
                              "scales) against fp32; measured <= 2e-2"),
}

#: what a reference needs to share with a job for the kind to be a replay (config sections and keys)
LAYOUT_KEYS = ("parallel", "zero", "precision", "activation_checkpointing", "model", "trainer.micro_batch_size",
               "trainer.global_batch_size", "trainer.compile", "device")

_PRECISION_KINDS = {"bf16": "bf16", "fp16": "fp16"}


def tolerance(kind: str) -> float:
    return TOLERANCES[kind][0]


def _select(cfg, key: str):
    from omegaconf import OmegaConf
    return OmegaConf.select(cfg, key)


def load_config(run_dir):
    """The resolved config a run (or a checkpoint step dir) saved."""
    from omegaconf import OmegaConf
    return OmegaConf.load(Path(run_dir) / "config.yaml")


def _compose(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from framework.config.paths import CONFIG_DIR
    from framework.config_store import register_configs
    register_configs()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=list(overrides))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def parity_kind(cfg_or_overrides) -> str:
    """The kind of a job against the single-process fp32 run of the same model, seed and global batch:
    a resolved config (a run dir's config.yaml, loaded), or the command line's overrides."""
    cfg = _compose(cfg_or_overrides) if isinstance(cfg_or_overrides, (list, tuple)) else cfg_or_overrides
    precision = _select(cfg, "precision.name") or "fp32"
    if precision == "float8":
        return "float8-emulated" if _select(cfg, "precision.float8_emulate") else "float8"
    if precision != "fp32":
        return _PRECISION_KINDS[precision]
    if _select(cfg, "parallel.comm_hook") not in (None, "none"):
        return "fp16-comm"
    if _select(cfg, "trainer.compile"):
        return "fp32-compiled"
    if _select(cfg, "parallel.name") == "deepspeed" and _select(cfg, "zero.offload_optimizer"):
        return "offload"
    if _select(cfg, "parallel.name") != "single":
        return "fp32-distributed"
    return "fp32"


def _loosest(kinds) -> str:
    """The kind with the largest tolerance; of equal ones the more specific (later in TOLERANCES)."""
    order = list(TOLERANCES)
    return max(kinds, key=lambda k: (TOLERANCES[k][0], order.index(k)))


def _read_records(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _by_step(run_dir) -> dict[int, dict]:
    out = {}
    for record in _read_records(run_dir):
        assert record["step"] not in out, f"{run_dir}/metrics.jsonl logs step {record['step']} twice"
        out[record["step"]] = record
    assert out, f"{run_dir}/metrics.jsonl holds no step"
    return out


def _layouts(run_dir) -> list[tuple]:
    """The layout signatures that trained a run: its own, and that of any checkpoint it resumed from (and
    so on back). A run dir's world sizes come from its metrics, a checkpoint's from its meta.json."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        worlds = tuple(sorted({r.get("world_size", 1) for r in _read_records(run_dir)}))
    else:
        worlds = (json.loads((run_dir / "meta.json").read_text())["world_size"],)
    out = [(_signature(cfg), worlds, parity_kind(cfg))]
    resume = _select(cfg, "checkpoint.resume")
    if resume not in (None, "auto") and (Path(resume) / "config.yaml").exists() and Path(resume) != run_dir:
        out += _layouts(resume)
    return out


def _signature(cfg) -> str:
    from omegaconf import OmegaConf
    return json.dumps({key: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for key in LAYOUT_KEYS for v in [_select(cfg, key)]}, sort_keys=True)


def kind_between(run_dir, reference_dir) -> str:
    """The kind of difference between a run and its reference, from the configs that trained them."""
    layouts = _layouts(run_dir) + _layouts(reference_dir)
    if len({(sig, worlds) for sig, worlds, _ in layouts}) == 1:
        return "fp32"
    return _loosest({"fp32-distributed", *(kind for _, _, kind in layouts)})


def _rel(got: float, want: float) -> float:
    if math.isnan(got) or math.isnan(want):
        return 0.0 if math.isnan(got) and math.isnan(want) else math.inf
    if got == want:
        return 0.0
    return abs(got - want) / max(abs(want), 1e-12)


def final_checkpoint(run_dir) -> Path | None:
    """The complete checkpoint of a run's last logged step, if it saved one there."""
    from framework.checkpoint.manager import checkpoint_dir, complete_checkpoints, step_dir_name
    run_dir = Path(run_dir)
    last = max(_by_step(run_dir))
    root = checkpoint_dir(load_config(run_dir), str(run_dir))
    wanted = Path(root) / step_dir_name(last)
    return wanted if str(wanted) in complete_checkpoints(root) else None


def _parameters(step_dir: Path) -> dict:
    from framework.checkpoint.manager import read_meta
    from framework.export.read import READERS
    return READERS[read_meta(str(step_dir))["format"]](str(step_dir))


def _parameter_diffs(run_ckpt: Path, ref_ckpt: Path) -> dict[str, tuple[float, float, float]]:
    """name -> (relative difference, |got|, |want|) for every parameter: the norm of the difference over
    the norm of the reference tensor (a per-tensor checksum that no single near-zero entry dominates)."""
    got, want = _parameters(run_ckpt), _parameters(ref_ckpt)
    assert set(got) == set(want), (f"{run_ckpt} and {ref_ckpt} hold different parameters: "
                                   f"{sorted(set(got) ^ set(want))[:5]}")
    out = {}
    for name in sorted(want):
        a, b = got[name].detach().double(), want[name].detach().double()
        assert a.shape == b.shape, f"parameter {name}: shape {tuple(a.shape)} vs reference {tuple(b.shape)}"
        norm = float(b.norm())
        out[name] = (float((a - b).norm()) / max(norm, 1e-12), float(a.norm()), norm)
    return out


def parity_report(run_dir, reference_dir, kind: str | None = None) -> dict:
    """{"kind", "tolerance", "steps", "loss", "grad_norm", "params"} and "val_loss" where the run evaluated:
    the largest relative difference of each quantity against the reference ("params" None where either run
    saved no final checkpoint), and for each where it is largest ("worst": quantity -> (step or parameter
    name, got, want))."""
    kind = kind or kind_between(run_dir, reference_dir)
    got, want = _by_step(run_dir), _by_step(reference_dir)
    missing = sorted(set(got) - set(want))
    assert not missing, f"the reference {reference_dir} logged no step {missing[0]} (it logged {sorted(want)})"
    report = {"kind": kind, "tolerance": tolerance(kind), "steps": sorted(got), "worst": {}}
    for quantity in ("loss", "grad_norm", "val_loss"):
        worst = (0.0, None)
        for step in sorted(got):
            if quantity == "val_loss" and quantity not in got[step]:
                continue
            a, b = float(got[step][quantity]), float(want[step].get(quantity, math.nan))
            if _rel(a, b) > worst[0] or worst[1] is None:
                worst = (_rel(a, b), (step, a, b))
        if worst[1] is not None:
            report[quantity], report["worst"][quantity] = worst
    report["params"] = None
    run_ckpt, ref_ckpt = final_checkpoint(run_dir), final_checkpoint(reference_dir)
    if run_ckpt is not None and ref_ckpt is not None and run_ckpt.name == ref_ckpt.name:
        diffs = _parameter_diffs(run_ckpt, ref_ckpt)
        name = max(diffs, key=lambda n: diffs[n][0])
        report["params"], report["worst"]["params"] = diffs[name][0], (name, diffs[name][1], diffs[name][2])
    return report


def assert_parity(run_dir, reference_dir, kind: str | None = None) -> dict:
    """Fail unless every logged step's loss and grad norm (and val_loss where the run evaluated), and every
    parameter of the final checkpoints (when both runs saved one at the same step), are within the kind's
    tolerance of the reference.
    `kind`: only where the configs cannot say it (another implementation of the model). Returns
    parity_report's dict."""
    report = parity_report(run_dir, reference_dir, kind)
    tol, failed = report["tolerance"], []
    for quantity in [q for q in ("grad_norm", "loss", "val_loss") if q in report]:
        step, a, b = report["worst"][quantity]
        failed.append((report[quantity], f"step {step}: {quantity} {a!r} vs reference {b!r}"))
    if report["params"] is not None:
        name, a, b = report["worst"]["params"]
        failed.append((report["params"], f"final parameter {name}: norm {a!r} vs reference {b!r}"))
    failed = sorted((f for f in failed if not f[0] <= tol), key=lambda f: -f[0])
    assert not failed, "; ".join(f"{what}: relative difference {rel:.3g} > {tol:g}" for rel, what in failed) + \
        f" ({report['kind']}; run {run_dir}, reference {reference_dir})"
    return report


def assert_series_parity(quantity: str, got: list[float], want: list[float], kind: str, first_step: int = 1) -> None:
    """One quantity per step against a reference that is not a run dir (a plain training loop)."""
    assert len(got) == len(want) and got, f"{quantity}: {len(got)} steps vs reference {len(want)}"
    tol = tolerance(kind)
    for i, (a, b) in enumerate(zip(got, want)):
        assert _rel(a, b) <= tol, (f"step {first_step + i}: {quantity} {a!r} vs reference {b!r}: relative "
                                   f"difference {_rel(a, b):.3g} > {tol:g} ({kind})")
