"""tests/harness/parity.py itself, on run dirs written here (no jobs): the kind comes from the configs, a replay is
held bit for bit, a resumed run counts the layout that saved its checkpoint, and a failure names the step,
the quantity and both values."""
import json
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from tests.harness.parity import TOLERANCES, assert_parity, kind_between, parity_kind, parity_report

STEPS = {"loss": [5.5, 5.2, 4.9], "grad_norm": [1.3, 0.9, 0.8]}


def _run(tmp_path, name, compose_config, overrides=(), scale=None, world=1, params=None):
    """A run dir as a job leaves it: its resolved config, metrics.jsonl (STEPS, each value times `scale`
    where given: {"quantity": {step: factor}}) and, with `params`, a final DCP checkpoint holding them."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    cfg = compose_config(["model=tiny", *overrides])
    OmegaConf.save(cfg, run_dir / "config.yaml")
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i in range(3):
            record = {"step": i + 1, "world_size": world}
            for key, values in STEPS.items():
                record[key] = values[i] * (scale or {}).get(key, {}).get(i + 1, 1.0)
            f.write(json.dumps(record) + "\n")
    if params is not None:
        import torch.distributed.checkpoint as dcp
        step = run_dir / "checkpoints" / "step_00000003"
        with warnings.catch_warnings():      # "assuming the intent is to save in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({"model": params}, checkpoint_id=str(step / "state"), no_dist=True)
        (step / "meta.json").write_text(json.dumps({"version": 1, "step": 3, "format": "dcp", "world_size": world}))
    return run_dir


def test_the_kind_of_a_job_comes_from_its_config(compose_config):
    kind = lambda *overrides: parity_kind(compose_config(["model=tiny", *overrides]))
    assert kind() == "fp32"
    assert kind("parallel=ddp") == kind("parallel=fsdp") == kind("parallel=deepspeed") == "fp32-distributed"
    assert kind("parallel=ddp", "parallel.comm_hook=fp16") == "fp16-comm"
    assert kind("trainer.compile=true") == "fp32-compiled"
    assert kind("precision=bf16") == kind("parallel=fsdp", "precision=bf16") == "bf16"
    assert kind("precision=float8", "precision.float8_emulate=true") == "float8-emulated"
    assert parity_kind(["parallel=ddp", "precision=fp16"]) == "fp16"          # overrides, composed
    assert all(k.tolerance <= k.params for k in TOLERANCES.values())


def test_a_replay_is_held_bit_for_bit_and_another_layout_to_its_kind(tmp_path, compose_config):
    ref = _run(tmp_path, "ref", compose_config)
    same = _run(tmp_path, "same", compose_config, scale={"loss": {2: 1 + 1e-7}})
    assert kind_between(same, ref) == "fp32"
    with pytest.raises(AssertionError, match=r"step 2: loss 5\.2000005\d* vs reference 5\.2: relative difference "
                                             r"1e-07 > 0 \(fp32;"):
        assert_parity(same, ref)
    ddp = _run(tmp_path, "ddp", compose_config, ["parallel=ddp"], scale={"loss": {2: 1 + 1e-7}}, world=2)
    assert assert_parity(ddp, ref)["kind"] == "fp32-distributed"
    micro = _run(tmp_path, "micro", compose_config, ["trainer.micro_batch_size=4"])   # other sums, one process
    assert kind_between(micro, ref) == "fp32-distributed"


def test_a_summed_gradient_fails_on_the_grad_norm(tmp_path, compose_config):
    ref = _run(tmp_path, "ref", compose_config)
    summed = _run(tmp_path, "summed", compose_config, ["parallel=ddp"], world=2,
                  scale={"grad_norm": {1: 2.0, 2: 2.0, 3: 2.0}, "loss": {3: 1 + 7e-5}})
    with pytest.raises(AssertionError) as failure:
        assert_parity(summed, ref)
    message = str(failure.value)
    assert message.startswith("step 1: grad_norm 2.6 vs reference 1.3: relative difference 1 > 1e-05")
    assert "step 3: loss" in message


def test_a_resumed_run_counts_the_layout_its_checkpoint_was_saved_by(tmp_path, compose_config):
    ref = _run(tmp_path, "ref", compose_config)
    saved = tmp_path / "fsdp_step"
    saved.mkdir()
    OmegaConf.save(compose_config(["model=tiny", "parallel=fsdp"]), saved / "config.yaml")
    (saved / "meta.json").write_text(json.dumps({"world_size": 2}))
    resumed = _run(tmp_path, "resumed", compose_config, [f"checkpoint.resume={saved}"])
    assert kind_between(resumed, ref) == "fp32-distributed"


def test_final_parameters_are_compared_as_one_vector(tmp_path, compose_config):
    weights = {"w": torch.ones(100), "tiny": torch.full((4,), 1e-6)}
    ref = _run(tmp_path, "ref", compose_config, params=weights)
    # the near-zero tensor differs by as much as it weighs: a tiny share of the whole
    noisy = _run(tmp_path, "noisy", compose_config, ["parallel=ddp"], world=2,
                 params={"w": torch.ones(100), "tiny": torch.full((4,), 2e-6)})
    report = assert_parity(noisy, ref)
    assert 0 < report["params"] < 1e-6 and report["worst"]["params"][0] == "tiny"
    off = _run(tmp_path, "off", compose_config, ["parallel=ddp"], world=2,
               params={"w": torch.ones(100) * (1 + 1e-3), "tiny": torch.full((4,), 1e-6)})
    with pytest.raises(AssertionError, match=r"final parameters \(most in w: a difference of norm 0.01"):
        assert_parity(off, ref)
    assert parity_report(_run(tmp_path, "unsaved", compose_config, ["parallel=ddp"], world=2), ref)["params"] is None
