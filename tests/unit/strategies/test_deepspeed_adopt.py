"""A user's DeepSpeed JSON sets the batch and the precision the user left at our defaults, before validation;
against an explicit choice it is refused. In-process: compose, validate, resolve (no workers)."""
import json

import pytest

from framework.config.explicit import explicit_keys
from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.strategies.deepspeed import resolve
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST

NO_MICRO = [a for a in FAST if not a.startswith("trainer.micro_batch_size")]     # global 8


@pytest.fixture
def run(compose_config, tmp_path):
    """Validate a deepspeed run on 2 ranks with this file and these overrides; the config and its JSON."""
    def validated(ds: dict, *args):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(ds))
        overrides = [*NO_MICRO, "parallel=deepspeed", f"parallel.ds_config={path}", *args]
        cfg = compose_config(overrides)
        derive_and_validate(cfg, 2, strategy_class("deepspeed"), explicit=explicit_keys(overrides))
        return cfg, resolve(cfg, 2)
    return validated


def test_a_files_bf16_switches_the_precision_group_as_the_command_line_would(run, compose_config):
    cfg, ds = run({"bf16": {"enabled": True}})
    assert cfg.precision == compose_config([*NO_MICRO, "parallel=deepspeed", "precision=bf16"]).precision
    assert ds["bf16"]["enabled"] is True
    with pytest.raises(ConfigError, match="bf16.enabled=true contradicts precision=fp32 chosen on the command line"):
        run({"bf16": {"enabled": True}}, "precision=fp32")


@pytest.mark.parametrize("file,args,micro,accumulation", [
    ({"gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": "auto"}, [], 2, 2),
    ({"gradient_accumulation_steps": 4}, [], 1, 4),
    ({"train_micro_batch_size_per_gpu": 1}, [], 1, 4),
    ({"gradient_accumulation_steps": "auto"}, ["trainer.micro_batch_size=2"], 2, 2),
    ({}, [], 4, 1),                                  # unset: a rank's share, no accumulation
])
def test_the_files_batch_becomes_the_runs_where_the_user_left_it(run, file, args, micro, accumulation):
    cfg, ds = run(file, *args)
    assert cfg.trainer.micro_batch_size == micro
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == \
        (8, micro, accumulation)


@pytest.mark.parametrize("file,args,message", [
    ({"gradient_accumulation_steps": 4}, ["trainer.micro_batch_size=2"],
     r"gradient_accumulation_steps=4 contradicts 2 = trainer.global_batch_size 8 / \(trainer.micro_batch_size 2"),
    ({"gradient_accumulation_steps": 3}, [],      # 8 sequences on 2 ranks cannot take 3 steps: not adopted
     r"gradient_accumulation_steps=3 contradicts 1 = trainer.global_batch_size 8 / \(trainer.micro_batch_size 4"),
    ({"train_micro_batch_size_per_gpu": 4}, ["trainer.micro_batch_size=2"],
     "train_micro_batch_size_per_gpu=4 contradicts trainer.micro_batch_size=2 chosen on the command line"),
])
def test_the_files_batch_against_the_runs_is_refused_naming_both(run, file, args, message):
    with pytest.raises(ConfigError, match=message):
        run(file, *args)
