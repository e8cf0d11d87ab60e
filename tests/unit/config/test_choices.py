"""Every choice field (`OneOf[...]` in a schema) refuses a value outside its set, before any other rule
runs, with one line naming the key and the set, and accepts each value in it. The fields come from the
composed config, so a new choice field is covered without touching this file. (Exit code 2 and the one
line end to end: test_validation's device=tpu case.)"""
import copy

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework.config.choices import check_choices, choice_fields
from framework.config.paths import CONFIG_DIR
from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.launch import admission
from framework.compose.config_store import register_configs
from framework.runtime import world
from framework.strategies.registry import strategy_class


def _compose(overrides=()):
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", admission.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", admission.hydra_output_subdir, replace=True)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


DEFAULT = _compose()
FIELDS = dict(choice_fields(DEFAULT))


def _with(key, value):
    cfg = copy.deepcopy(DEFAULT)
    OmegaConf.update(cfg, key, value)
    return cfg


def test_the_schema_has_choice_fields():
    assert {"trainer.on_nonfinite", "scheduler.name", "data.source", "device"} <= set(FIELDS)


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_value_outside_the_set_is_refused_first(key):
    cfg = _with(key, "bogus")
    cls = strategy_class(cfg.parallel.name)
    with pytest.raises(ConfigError) as err:
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)
    shown = "|".join("null" if v is None else str(v) for v in FIELDS[key])    # an Optional field also takes null
    assert str(err.value) == f"{key}: 'bogus' is not one of {shown}"


@pytest.mark.parametrize("key,value", [(k, v) for k in sorted(FIELDS) for v in FIELDS[k]])
def test_each_value_in_the_set_is_accepted(key, value):
    check_choices(_with(key, value))
