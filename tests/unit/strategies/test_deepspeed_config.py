"""The DeepSpeed JSON comes from the run's config groups; a user's file is reconciled with them.

In-process: compose the config, resolve it (no deepspeed import, no workers). The end-to-end
runs and the exit-2 path of the real entrypoint are in test_deepspeed.py.
"""
import json

import pytest

from framework.errors import ConfigError
from framework.config.explicit import explicit_keys
from tests.harness.helpers import derive_and_validate
from framework.strategies.deepspeed import config as dsc
from framework.strategies.deepspeed import ops as dso
from framework.strategies.deepspeed.values import autos
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, REPO

FIXTURES = REPO / "tests" / "fixtures" / "deepspeed"


_EXPLICIT: dict[int, set[str]] = {}


@pytest.fixture(scope="module")
def composer(compose_config):
    """Compose as the command line would, remembering which keys that command line chose explicitly."""
    def compose(*args):
        overrides = [*FAST, "parallel=deepspeed", *args]
        cfg = compose_config(overrides)
        _EXPLICIT[id(cfg)] = explicit_keys(overrides)
        return cfg
    return compose


def _validate(cfg, world_size=2):
    derive_and_validate(cfg, world_size, strategy_class("deepspeed"), explicit=_EXPLICIT[id(cfg)])


def test_generated_batch_arithmetic_and_groups(composer):
    cfg = composer("trainer.global_batch_size=24", "trainer.micro_batch_size=3", "zero=stage3",
                   "zero.offload_optimizer=true", "zero.offload_params=true", "precision=bf16",
                   "trainer.grad_clip=0.5", "parallel.stage3_prefetch_bucket_size=1234")
    _validate(cfg, 4)
    ds = dsc.resolve(cfg, 4)
    assert ds["train_batch_size"] == 24 and ds["train_micro_batch_size_per_gpu"] == 3
    assert ds["gradient_accumulation_steps"] == 2 == 24 // (3 * 4)
    assert ds["gradient_clipping"] == 0.5
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_prefetch_bucket_size"] == 1234
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert ds["zero_force_ds_cpu_optimizer"] is False and "optimizer" not in ds   # our torch AdamW steps


def test_fp16_section_uses_the_precision_groups_loss_scaling(composer):
    cfg = composer("precision=fp16", "precision.init_scale=1024", "precision.growth_interval=50")
    fp16 = dsc.generate(cfg, 2)["fp16"]
    assert fp16 == {"enabled": True, "loss_scale": 0, "initial_scale_power": 10, "loss_scale_window": 50,
                    "hysteresis": 2, "min_loss_scale": 1.0}


def test_deepspeed_optimizer_section_mirrors_the_optimizer_group(composer):
    cfg = composer("parallel.use_deepspeed_optimizer=true", "optimizer.lr=1e-4")
    assert dsc.generate(cfg, 2)["optimizer"] == {
        "type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8}}
    with pytest.raises(ConfigError, match="parallel.use_deepspeed_optimizer: DeepSpeed builds"):
        _validate(composer("parallel.use_deepspeed_optimizer=true", "optimizer=sgd"))


def test_good_file_keeps_its_extra_keys(composer):
    cfg = composer(f"parallel.ds_config={FIXTURES / 'good.json'}", "zero=stage2")
    _validate(cfg)
    ds = dsc.resolve(cfg, 2)
    assert ds["zero_optimization"]["reduce_bucket_size"] == 2000000     # the file's knob wins over the default
    assert ds["zero_optimization"]["overlap_comm"] is False and ds["wall_clock_breakdown"] is False


def test_auto_file_is_filled_from_the_run(composer):
    cfg = composer(f"parallel.ds_config={FIXTURES / 'auto.json'}", "zero=stage2", "zero.offload_optimizer=true",
                   "parallel.reduce_bucket_size=777")
    ds = dsc.resolve(cfg, 2)
    assert autos(ds) == []
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2, 2)
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"]["enabled"] is False and ds["fp16"]["enabled"] is False
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["reduce_bucket_size"] == 777


def test_contradicting_file_names_both_values(composer):
    with pytest.raises(ConfigError) as err:
        _validate(composer(f"parallel.ds_config={FIXTURES / 'contradicting.json'}", "zero=none"))
    msg = str(err.value)
    assert msg.startswith("parallel.ds_config")
    assert "train_batch_size=16 contradicts trainer.global_batch_size=8" in msg
    assert "zero_optimization.stage=2 contradicts zero.stage=0" in msg


def test_a_knob_set_on_both_sides_must_agree(composer):
    with pytest.raises(ConfigError, match="reduce_bucket_size=2000000 contradicts parallel.reduce_bucket_size=5"):
        _validate(composer(f"parallel.ds_config={FIXTURES / 'good.json'}", "zero=stage2",
                           "parallel.reduce_bucket_size=5"))


def test_overrides_merge_last_and_are_checked_too(composer):
    cfg = composer("zero=stage1", "+parallel.overrides.wall_clock_breakdown=true",
                   "+parallel.overrides.zero_optimization.round_robin_gradients=true")
    ds = dsc.resolve(cfg, 2)
    assert ds["wall_clock_breakdown"] is True and ds["zero_optimization"]["round_robin_gradients"] is True
    with pytest.raises(ConfigError, match="parallel.overrides: gradient_clipping=2.0 contradicts trainer.grad_clip=1.0"):
        _validate(composer("+parallel.overrides.gradient_clipping=2.0"))


def test_seed_example_fails_with_every_actionable_error(composer):
    """Fixed values contradicting what the command line chose explicitly (FAST's batch, lr, warm-up; zero=none)."""
    with pytest.raises(ConfigError) as err:
        _validate(composer(f"parallel.ds_config={FIXTURES / 'seed_ds_config.json'}", "zero=none",
                           "zero.offload_optimizer=false"))
    msg = str(err.value)
    for expected in ("train_batch_size=256 contradicts trainer.global_batch_size=8",
                     "train_micro_batch_size_per_gpu=4 contradicts trainer.micro_batch_size=2",
                     "fp16.enabled=true cannot run on this machine",
                     "zero_optimization.stage=3 contradicts zero.stage=0",
                     'zero_optimization.offload_optimizer.device="cpu" contradicts zero.offload_optimizer=false',
                     "scheduler.params.warmup_max_lr=1e-05 contradicts optimizer.lr=0.003",
                     "scheduler.params.warmup_num_steps=1000 contradicts scheduler.warmup_steps=2",
                     "optimizer.params.lr=1e-05 contradicts optimizer.lr=0.003"):
        assert expected in msg, msg
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=8 contradicts 2 = trainer.global_batch_size 8 / "
                                          r"\(trainer.micro_batch_size 2 x 2 ranks\)"):
        _validate(composer("+parallel.overrides.gradient_accumulation_steps=8"))


@pytest.mark.parametrize("name,stage,offload_params", [("ds_config_zero2", 2, False), ("ds_config_zero3", 3, True)])
def test_public_auto_files_set_what_the_user_left_at_our_defaults(compose_config, name, stage, offload_params):
    """transformers'/accelerate's files with no other override: their fixed values become the run's."""
    overrides = ["parallel=deepspeed", f"parallel.ds_config={FIXTURES / (name + '.json')}"]
    cfg = compose_config(overrides)
    derive_and_validate(cfg, 2, strategy_class("deepspeed"), explicit=explicit_keys(overrides))
    assert (cfg.zero.stage, cfg.zero.offload_optimizer, cfg.zero.offload_params) == (stage, True, offload_params)
    ds = dsc.resolve(cfg, 2)
    assert autos(ds) == [] and "optimizer" not in ds      # the torch AdamW of optimizer.* steps
    assert ds["scheduler"]["params"] == {"warmup_min_lr": 0.0, "warmup_max_lr": cfg.optimizer.lr,
                                         "warmup_num_steps": cfg.scheduler.warmup_steps}
    assert ds["train_batch_size"] == cfg.trainer.global_batch_size and ds["fp16"]["enabled"] is False


def test_a_fixed_value_against_an_explicit_choice_names_both_sides(composer):
    with pytest.raises(ConfigError, match="zero_optimization.stage=2 contradicts zero.stage=3 chosen on the command"):
        _validate(composer(f"parallel.ds_config={FIXTURES / 'ds_config_zero2.json'}", "zero=stage3"))
    with pytest.raises(ConfigError, match="scheduler \\(WarmupLR\\) contradicts scheduler=cosine chosen"):
        _validate(composer(f"parallel.ds_config={FIXTURES / 'ds_config_zero2.json'}", "scheduler=cosine"))


def test_seed_example_fp16_is_refused_on_cpu_even_when_everything_else_agrees(composer):
    overrides = ("{train_batch_size:auto,train_micro_batch_size_per_gpu:auto,gradient_accumulation_steps:auto,"
                 "optimizer:null,scheduler:null}")
    with pytest.raises(ConfigError, match="use precision=bf16"):
        _validate(composer(f"parallel.ds_config={FIXTURES / 'seed_ds_config.json'}", "zero=stage3",
                           "zero.offload_optimizer=true", "zero.offload_params=true", "precision=fp16",
                           f"++parallel.overrides={overrides}"))


@pytest.mark.parametrize("args,expected", [
    (["zero=none", "zero.offload_optimizer=true"], "zero.offload_optimizer: DeepSpeed offloads optimizer states"),
    (["zero=stage2", "zero.offload_params=true"], "zero.offload_params: DeepSpeed offloads parameters only with zero=stage3"),
    (["zero=stage2", "zero.offload_optimizer=true", "parallel.nvme_path=/no/such/dir"], "parallel.nvme_path: no such directory"),
    (["parallel.nvme_path=/tmp"], "parallel.nvme_path: is used only with"),
    (["parallel.ds_config=/no/such.json"], "parallel.ds_config: no such file"),
    (["parallel.dp_shard=2"], "parallel.dp_shard: parallel=deepspeed has no dp_shard dimension (every rank is a data-parallel one)"),
    (["parallel.tp=2"], "parallel.tp: parallel=deepspeed has no tp dimension"),
])
def test_invalid_options_name_the_key(composer, args, expected):
    with pytest.raises(ConfigError) as err:
        _validate(composer(*args))
    assert expected in str(err.value)


def test_written_json_round_trips(tmp_path, composer):
    ds = dsc.resolve(composer("zero=stage1"), 2)
    assert json.loads(open(dsc.write(ds, str(tmp_path))).read()) == ds


# ---- DeepSpeed's own Adam on CUDA: a prebuilt kernel, or torch's Adam (no nvcc at run time) ----------

@pytest.mark.parametrize("args,op,prebuilt,expected", [
    ([], "fused_adam", False, True),
    ([], "fused_adam", True, None),
    (["zero=stage2", "zero.offload_optimizer=true"], "cpu_adam", False, True),
    (["zero=stage2", "zero.offload_optimizer=true"], "cpu_adam", True, None),
])
def test_deepspeed_adam_on_cuda_is_torch_adam_unless_its_op_is_prebuilt(composer, monkeypatch, args, op,
                                                                         prebuilt, expected):
    asked = []
    monkeypatch.setattr(dso, "prebuilt", lambda name: asked.append(name) or prebuilt)
    cfg = composer("device=cuda", "parallel.use_deepspeed_optimizer=true", *args)
    assert dsc.resolve(cfg, 2)["optimizer"]["params"].get("torch_adam") is expected
    assert asked == [op]


def test_deepspeed_adam_on_cpu_is_left_to_deepspeed(composer, monkeypatch):
    monkeypatch.setattr(dso, "prebuilt", lambda name: pytest.fail("CPU runs never ask for CUDA kernels"))
    cfg = composer("device=cpu", "parallel.use_deepspeed_optimizer=true")
    assert "torch_adam" not in dsc.resolve(cfg, 2)["optimizer"]["params"]


def test_asking_for_a_kernel_that_cannot_be_built_names_nvcc(composer, monkeypatch):
    monkeypatch.setattr(dso, "prebuilt", lambda name: False)
    monkeypatch.setattr(dso, "has_nvcc", lambda: False)
    cfg = composer("device=cuda", "parallel.use_deepspeed_optimizer=true",
                   "+parallel.overrides={optimizer: {params: {torch_adam: false}}}")
    with pytest.raises(ConfigError) as err:
        dsc.resolve(cfg, 2)
    assert str(err.value).startswith("parallel.overrides: optimizer.params.torch_adam=false asks for DeepSpeed's "
                                     "fused_adam kernel, which this deepspeed install did not prebuild")
    assert "no nvcc" in str(err.value) and "DS_BUILD_FUSED_ADAM=1" in str(err.value)
    monkeypatch.setattr(dso, "has_nvcc", lambda: True)     # with nvcc DeepSpeed may compile it: the user's call
    assert dsc.resolve(cfg, 2)["optimizer"]["params"]["torch_adam"] is False
