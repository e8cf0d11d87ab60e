"""The one parity check of a job against its reference run: per step the loss and the grad norm
(metrics.jsonl; val_loss too where the job evaluated), and at the end every parameter of the two final
checkpoints, each held to the tolerance of the kind of difference between the two runs. Every layout
test calls `assert_parity`; the kinds and their tolerances are stated once, in TOLERANCES, with what they
were measured at (benchmarks/parity_tolerances.py) and why runs of that kind differ.

The kind is read from the runs' resolved configs (config.yaml), never chosen by a test: a job whose
layout, precision and kernels are its reference's (a resume, a restart, another launcher) is a replay,
"fp32", held bit for bit; a layout that sums in another order is "fp32-distributed"; reduced precision,
compiled kernels and compressed gradients have their own. A resumed run brings the config of the
checkpoint it started from: what trained its first steps counts too.

The final parameters are compared as one vector (the norm of the difference over the reference's norm, the
tensor that differs most named), with a tolerance of their own: AdamW divides each update by the root of
the gradient's second moment, so an entry whose gradient is only rounding noise (GPT-2's key bias, which
softmax cancels) moves by noise alone and differs by as much as it weighs, and the weights drift further
apart than the loss wherever gradients are rounded.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple


class Kind(NamedTuple):
    tolerance: float    #: relative, for the loss, grad norm and val_loss of every step
    reason: str         #: why runs of this kind differ from their reference, and what was measured
    params: float       #: relative, for the final parameters (every tensor, as one vector)


#: kind -> (relative tolerance, reason, parameter tolerance). Measured on this project's CPU jobs (model=tiny,
#: FAST's 8 steps at lr 3e-3) by benchmarks/parity_tolerances.py: the largest relative difference of
#: loss / grad norm / final parameters against the single-process fp32 run over every layout named.
TOLERANCES: dict[str, Kind] = {
    "fp32": Kind(0.0, "a replay: the same layout, precision and kernels as the reference, summing in the same "
                      "order (a resume, a restart, a preemption, another launcher); CPU kernels repeat bit for "
                      "bit: measured 0 / 0 / 0 for single, ddp, fsdp, 3d tp2 and deepspeed zero3 resumes", 0.0),
    "fp32-distributed": Kind(1e-5, "the same fp32 math summed in another order: over ranks, shards, "
                                   "tensor-parallel splits, pipeline stages, micro-batches (ddp, zero1, fsdp "
                                   "zero2/3, hsdp, fsdp x4, fsdp offload, 3d tp2/sp/pp2/2x2x2, deepspeed zero "
                                   "0-3 and CPU-offloaded Adam, torch's or DeepSpeedCPUAdam; transformers' Llama "
                                   "and GPT-2 under fsdp and deepspeed); measured <= 9.5e-8 / 4.4e-7 / 1.1e-6 "
                                   "(GPT-2's key biases move on rounding noise alone); a gradient sum instead of "
                                   "a mean is a grad-norm error of 1.0 (and a loss error of 7e-5)", 1e-5),
    "fp32-implementation": Kind(1e-5, "another implementation of the same fp32 model and step (a plain "
                                      "transformers training loop against model=hf, transformers' Llama against "
                                      "ours from the same weights): other op orders; measured <= 1.0e-7 / 1.8e-7 "
                                      "(no final weights: the plain loop saves none, the two Llamas name theirs "
                                      "apart)", 1e-5),
    "fp32-compiled": Kind(1e-5, "torch.compile's generated kernels fuse and reorder the sums (single, ddp, 3d "
                                "tp2); measured <= 9.5e-8 / 1.5e-7 / 1.6e-7", 1e-5),
    "fp32-muon": Kind(5e-4, "optimizer=muon in another layout: torch.optim.Muon orthogonalises in bf16, so a "
                            "gradient summed in another order (fp32-distributed's 1e-7) rounds to another bf16 "
                            "value here and there, and the update moves by bf16's steps; the sharded step itself "
                            "is single's bit for bit (tests/integration/optim/test_muon_sharded_step.py); measured "
                            "<= 4.2e-6 / 7.0e-5 / 3.2e-4 (ddp x2, whose matrices are whole, 2.9e-6 / 5.5e-5 / "
                            "2.6e-4 alike; zero1, fsdp zero2/3, 3d dp2 x tp2; 6 steps); orthogonalising shards "
                            "instead of whole matrices moves the parameters by 1e-2", 2e-3),
    "fp16-comm": Kind(5e-4, "gradients rounded to fp16 for the all-reduce (parallel.comm_hook=fp16); measured "
                            "2.4e-6 / 4.7e-5 / 2.7e-4", 2e-3),
    "fp16": Kind(5e-4, "fp16 autocast with a loss scale against fp32 (single, ddp); measured 3.2e-6 / 5.8e-5 / "
                       "4.3e-4", 2e-3),
    "bf16": Kind(5e-3, "bf16 activations (autocast) or bf16 weights and activations (FSDP2's and DeepSpeed's "
                       "mixed precision) against fp32 (single, fsdp zero2, 3d tp2 x pp2, 3d pp2 x dp2, deepspeed "
                       "zero2); measured <= 2.5e-4 / 9.7e-4 / 3.0e-3", 1.5e-2),
    "bf16-params": Kind(5e-3, "bf16 parameters, gradients and optimizer states (precision.store_dtype=bfloat16) "
                              "against single's run of the same mode: a gradient summed in another order (over "
                              "ranks, shards, tensor-parallel splits, stages) moves a weight to a neighbouring bf16 "
                              "value here and there, and bf16 steps are 2^-8 of it; measured <= 3.7e-5 / 8.8e-4 / "
                              "2.4e-3 (ddp x2, fsdp zero2/3 x2, 3d tp2; 3d pp2 bit for bit; 8 steps, torch's "
                              "AdamW)", 1e-2),
    "float8-emulated": Kind(3e-2, "the blocks' matmuls in emulated float8 (tensorwise scales) against fp32 "
                                  "(single; fsdp zero3's loss and grad norm); measured <= 5.9e-4 / 6.3e-3 / "
                                  "1.3e-2", 5e-2),
}

#: what a reference needs to share with a job for the kind to be a replay (config sections and keys)
LAYOUT_KEYS = ("parallel", "zero", "precision", "activation_checkpointing", "model", "trainer.micro_batch_size",
               "trainer.global_batch_size", "trainer.compile", "device")

_PRECISION_KINDS = {"bf16": "bf16", "fp16": "fp16"}


def tolerance(kind: str) -> float:
    assert kind in TOLERANCES, (f"no tolerance measured for kind {kind!r} yet: measure it with "
                                f"benchmarks/parity_tolerances.py and state it in tests/harness/parity.py")
    return TOLERANCES[kind].tolerance


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
    from framework.compose.config_store import register_configs
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
    if precision == "bf16" and _select(cfg, "precision.store_dtype") == "bfloat16":
        return "bf16-params"
    if precision != "fp32":
        return _PRECISION_KINDS[precision]
    if _select(cfg, "parallel.comm_hook") not in (None, "none"):
        return "fp16-comm"
    if _select(cfg, "trainer.compile"):
        return "fp32-compiled"
    if _select(cfg, "optimizer._target_") == "framework.optim.muon.MuonWithAdamW":
        return "fp32-muon"
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
    from framework.checkpoint.names import checkpoint_dir, complete_checkpoints, step_dir_name
    run_dir = Path(run_dir)
    last = max(_by_step(run_dir))
    root = checkpoint_dir(load_config(run_dir), str(run_dir))
    wanted = Path(root) / step_dir_name(last)
    return wanted if str(wanted) in complete_checkpoints(root) else None


def _parameters(step_dir: Path) -> dict:
    from framework.checkpoint.names import read_meta
    from framework.export.read import READERS
    return READERS[read_meta(str(step_dir))["format"]](str(step_dir))


def _plain(tensor):
    """A quantized frozen weight (torchao's NF4Tensor under lora.base_dtype=nf4) as the values it stands for."""
    return tensor.get_original_weight() if hasattr(tensor, "get_original_weight") else tensor


def _parameter_diffs(run_ckpt: Path, ref_ckpt: Path) -> dict[str, tuple[float, float]]:
    """name -> (norm of the difference, norm of the reference tensor) for every parameter."""
    got, want = _parameters(run_ckpt), _parameters(ref_ckpt)
    assert set(got) == set(want), (f"{run_ckpt} and {ref_ckpt} hold different parameters: "
                                   f"{sorted(set(got) ^ set(want))[:5]}")
    out = {}
    for name in sorted(want):
        a, b = (_plain(t).detach().double() for t in (got[name], want[name]))
        assert a.shape == b.shape, f"parameter {name}: shape {tuple(a.shape)} vs reference {tuple(b.shape)}"
        out[name] = (float((a - b).norm()), float(b.norm()))
    return out


def parity_report(run_dir, reference_dir, kind: str | None = None) -> dict:
    """{"kind", "tolerance", "params_tolerance", "steps", "loss", "grad_norm", "params"}, and "val_loss" where
    the run evaluated: the largest relative difference of each quantity against the reference ("params": of
    all final parameters as one vector, None where either run saved no final checkpoint), and where it is
    ("worst": quantity -> (step, got, want); for "params" (the tensor differing most, the norm of its
    difference, its norm))."""
    kind = kind or kind_between(run_dir, reference_dir)
    got, want = _by_step(run_dir), _by_step(reference_dir)
    missing = sorted(set(got) - set(want))
    assert not missing, f"the reference {reference_dir} logged no step {missing[0]} (it logged {sorted(want)})"
    report = {"kind": kind, "tolerance": tolerance(kind), "params_tolerance": TOLERANCES[kind].params,
              "steps": sorted(got), "worst": {}}
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
        total = math.sqrt(sum(ref ** 2 for _, ref in diffs.values()))
        name = max(diffs, key=lambda n: diffs[n][0])
        report["params"] = math.sqrt(sum(d ** 2 for d, _ in diffs.values())) / max(total, 1e-12)
        report["worst"]["params"] = (name, *diffs[name])
    return report


def assert_parity(run_dir, reference_dir, kind: str | None = None) -> dict:
    """Fail unless every logged step's loss and grad norm (and val_loss where the run evaluated), and every
    parameter of the final checkpoints (when both runs saved one at the same step), are within the kind's
    tolerance of the reference.
    `kind`: only where the configs cannot say it (another implementation of the model). Returns
    parity_report's dict."""
    report = parity_report(run_dir, reference_dir, kind)
    failed = []
    for quantity in [q for q in ("grad_norm", "loss", "val_loss") if q in report]:
        step, a, b = report["worst"][quantity]
        failed.append((report[quantity], report["tolerance"], f"step {step}: {quantity} {a!r} vs reference {b!r}"))
    if report["params"] is not None:
        name, diff, norm = report["worst"]["params"]
        failed.append((report["params"], report["params_tolerance"],
                       f"final parameters (most in {name}: a difference of norm {diff:.3g} in a tensor of "
                       f"norm {norm:.3g})"))
    failed = sorted((f for f in failed if not f[0] <= f[1]), key=lambda f: -f[0] / max(f[1], 1e-30))
    assert not failed, "; ".join(f"{what}: relative difference {rel:.3g} > {tol:g}" for rel, tol, what in failed) + \
        f" ({report['kind']}; run {run_dir}, reference {reference_dir})"
    return report


def assert_series_parity(quantity: str, got: list[float], want: list[float], kind: str, first_step: int = 1) -> None:
    """One quantity per step against a reference that is not a run dir (a plain training loop)."""
    assert len(got) == len(want) and got, f"{quantity}: {len(got)} steps vs reference {len(want)}"
    tol = tolerance(kind)
    for i, (a, b) in enumerate(zip(got, want)):
        assert _rel(a, b) <= tol, (f"step {first_step + i}: {quantity} {a!r} vs reference {b!r}: relative "
                                   f"difference {_rel(a, b):.3g} > {tol:g} ({kind})")
