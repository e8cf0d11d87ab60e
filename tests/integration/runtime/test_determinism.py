"""trainer.deterministic sets what it says in a fresh process (the settings are process-wide, so
each check runs in its own interpreter) while the job runs and leaves the process as it found it (a
multirun's next point runs there), sets nothing when off, respects NCCL choices made outside, and is
refused with one line where a strategy cannot honour it."""
import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.runtime.determinism import ENVIRONMENT, validate
from framework.strategies.registry import strategy_class

from tests.harness.helpers import FAST, REPO, check_ok, run_framework

PROBE = """
import json, sys
from omegaconf import OmegaConf
from framework.runtime import determinism
before = determinism.settings()
with determinism.applied(OmegaConf.create({"trainer": {"deterministic": sys.argv[1] == "true"}})):
    during = determinism.settings()
print(json.dumps({"before": before, "during": during, "after": determinism.settings()}))
"""


def _probe(on: bool, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", PROBE, "true" if on else "false"], cwd=REPO, check=True,
                         env={**clean, **env}, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _settings_after_apply(on: bool, **env) -> dict:
    return _probe(on, **env)["during"]


def test_switch_on_sets_every_setting_and_off_sets_none():
    on, off = _settings_after_apply(True), _settings_after_apply(False)
    assert on == {**ENVIRONMENT, "deterministic_algorithms": True, "cudnn_deterministic": True,
                  "flash_sdp": False, "mem_efficient_sdp": False, "math_sdp": True}
    assert off["deterministic_algorithms"] is False and off["flash_sdp"] is True
    assert all(off[name] is None for name in ENVIRONMENT)


def test_the_process_is_as_it_was_after_a_deterministic_job():
    # a multirun runs its one-process points in one process: after a trainer.deterministic=true point, the
    # next point (float8 emulated, rowwise) gave other numbers than the same point alone
    probe = _probe(True)
    assert probe["during"] != probe["before"] and probe["after"] == probe["before"]


def test_an_nccl_algorithm_set_outside_is_kept():
    assert _settings_after_apply(True, NCCL_ALGO="Tree")["NCCL_ALGO"] == "Tree"


def test_deepspeed_is_refused_and_torch_native_strategies_are_not():
    cfg = OmegaConf.create({"trainer": {"deterministic": True}})
    with pytest.raises(ConfigError, match="trainer.deterministic"):
        validate(cfg, strategy_class("deepspeed"))
    for name in ("single", "ddp", "fsdp", "3d"):
        validate(cfg, strategy_class(name))


def test_refusal_is_one_line_and_exit_2_before_work(tmp_path):
    proc = run_framework([*FAST, "parallel=deepspeed", "trainer.deterministic=true"], tmp_path / "run", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: trainer.deterministic: parallel=deepspeed")


def test_every_worker_of_a_ddp_job_has_the_settings(tmp_path):
    fixture = REPO / "tests" / "fixtures" / "determinism"
    env = {"FRAMEWORK_TEST_DETERMINISM": str(tmp_path / "settings"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(fixture), os.environ.get("PYTHONPATH")) if p)}
    check_ok(run_framework([*FAST, "parallel=ddp", "trainer.max_steps=2", "trainer.deterministic=true"],
                           tmp_path / "run", env=env))
    for rank in (0, 1):
        got = json.loads((tmp_path / "settings" / f"settings_rank{rank}.json").read_text())
        assert got == {**ENVIRONMENT, "deterministic_algorithms": True, "cudnn_deterministic": True,
                       "flash_sdp": False, "mem_efficient_sdp": False, "math_sdp": True}, rank
