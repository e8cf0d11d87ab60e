"""The precision group: bf16 tracks fp32, fp16 loss scaling skips overflowing steps and backs off."""
import math

import pytest
import torch
from omegaconf import OmegaConf

from framework.config.schema import PrecisionConfig
from framework.errors import ConfigError
from framework.models.llama import Llama, init_weights
import framework.parallel.precision as precision
from tests.harness.helpers import read_metrics, run_framework, train, train_run
from tests.harness.parity import assert_parity

# A loss scale that overflows fp16 by construction: even a gradient of 1/max is pushed past max.
OVERFLOWING_SCALE = torch.finfo(torch.float16).max ** 2


def fp16_cfg(**kw):
    return OmegaConf.create({"device": "cpu", "precision": OmegaConf.structured(
        PrecisionConfig(name="fp16", param_dtype="float16", **kw))})


def tiny_model():
    model = Llama(dim=32, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=64)
    init_weights(model, seed=0)
    return model


def scaled_step(plugin, model, optimizer) -> bool:
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with plugin.autocast():
        logits = model(tokens)
    plugin.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()))
    plugin.unscale_(optimizer)
    stepped = plugin.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return stepped


def test_fp16_overflow_skips_the_step_and_backs_off_the_scale():
    cfg = fp16_cfg(init_scale=OVERFLOWING_SCALE)
    plugin = precision.build_precision(cfg, torch.device("cpu"))
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    assert scaled_step(plugin, model, optimizer) is False
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), "a skipped step changed weights"
    assert plugin.metrics() == {"loss_scale": OVERFLOWING_SCALE * cfg.precision.backoff_factor, "skipped_steps": 1}

    # Back off until the scaled gradients fit; then steps go through and the count stays.
    skipped = 1
    while not scaled_step(plugin, model, optimizer):
        skipped += 1
    assert plugin.metrics()["skipped_steps"] == skipped
    assert plugin.metrics()["loss_scale"] == OVERFLOWING_SCALE * cfg.precision.backoff_factor ** skipped
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    restored = precision.build_precision(cfg, torch.device("cpu"))
    restored.load_state_dict(plugin.state_dict())
    assert restored.metrics() == plugin.metrics()


def test_fp16_scale_grows_after_clean_steps():
    cfg = fp16_cfg(growth_interval=2)
    plugin = precision.build_precision(cfg, torch.device("cpu"))
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    assert scaled_step(plugin, model, optimizer) and scaled_step(plugin, model, optimizer)
    assert plugin.metrics()["loss_scale"] == cfg.precision.init_scale * cfg.precision.growth_factor


def test_fsdp_fp16_overflow_is_skipped_on_every_shard_and_logged(tmp_path):
    backoff = 1e-3
    train(tmp_path, "fsdp_fp16", ["parallel=fsdp", "zero=stage3", "precision=fp16",
                                  f"precision.init_scale={OVERFLOWING_SCALE}", f"precision.backoff_factor={backoff}"])
    records = read_metrics(tmp_path / "fsdp_fp16")
    first, last = records[0], records[-1]
    assert first["skipped_steps"] == 1 and first["optim_state_bytes"] == 0      # no optimizer step ran
    skipped = last["skipped_steps"]
    assert 1 <= skipped < len(records)
    assert last["loss_scale"] == pytest.approx(OVERFLOWING_SCALE * backoff ** skipped, rel=1e-6)
    assert last["optim_state_bytes"] > 0
    assert all(math.isfinite(r["loss"]) for r in records) and last["loss"] < first["loss"]


def test_bf16_tracks_fp32_on_the_default_corpus(tmp_path):
    """50 steps of the default corpus (pydoc); bf16 autocast ends within a few percent of fp32."""
    args = ["model=tiny", "data.seq_len=64", "trainer.max_steps=50", "trainer.global_batch_size=8",
            "trainer.micro_batch_size=8", "trainer.log_every=10", "trainer.eval_every=0",
            "trainer.progress_bar=false", "logging.trackers=[]"]
    fp32 = train(tmp_path, "fp32", [*args, "precision=fp32"])
    bf16 = train(tmp_path, "bf16", [*args, "precision=bf16"])
    assert all(math.isfinite(x) for x in bf16)
    assert fp32[-1] < 0.8 * fp32[0], "the reference did not learn"
    assert abs(bf16[-1] - fp32[-1]) / fp32[-1] <= 0.03


def test_fsdp_bf16_mixed_precision_policy_tracks_fp32(tmp_path, reference_run):
    run_dir = train_run(tmp_path, "fsdp_bf16", ["parallel=fsdp", "zero=stage2", "precision=bf16"])
    assert assert_parity(run_dir, reference_run())["kind"] == "bf16"


def test_precision_the_device_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(precision, "compute_supported", lambda dtype, device_type: False)
    with pytest.raises(ConfigError) as err:
        precision.validate_precision(fp16_cfg())
    assert str(err.value).startswith("precision: this cpu cannot train in float16")


@pytest.mark.parametrize("args,key", [
    (["precision=fp16", "precision.param_dtype=bfloat16"], "precision.param_dtype"),
    (["parallel=ddp", "precision=bf16", "precision.reduce_dtype=bfloat16"], "precision.reduce_dtype"),
])
def test_invalid_precision_exits_2_with_one_line(tmp_path, args, key):
    proc = run_framework(["model=tiny", *args], tmp_path / "run", timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: "), proc.stderr
