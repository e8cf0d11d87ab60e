"""docs/how-to/ray.md: every `python -m framework` command on the page runs as written, from a directory outside
the checkout. Without an address the job starts a Ray instance of its own; with the tests' FAST settings appended it
also shows fault tolerance: a Ray worker killed mid-run, the group restarted by Ray from the newest checkpoint, the
uninterrupted losses. The KubeRay RayJob it prints validates against KubeRay's CRD schema. The page's command for
an existing cluster runs in test_ray_engine, on the Ray cluster that module starts. Every command runs in README's
environment plus the ray extra the page installs."""
import os
import sys

import jsonschema
import yaml

from tests.harness.helpers import FAST, REPO, check_ok, losses, max_rel_diff, read_metrics, run_in_own_session
from tests.harness.docs_commands import environment, run_by
from tests.harness.servers import RAY_CLIENT_ENV
from tests.integration.k8s.test_k8s import RAYJOB_SCHEMA

COMMANDS = run_by(__file__)
LOCAL, EXISTING, KUBERAY = [c.text.split(" | ")[0] for c in COMMANDS]     # kubectl: not here
EXACT = 1e-6


def shell(command: str, cwd, env: dict, *appended: str):
    """The page's line through bash (its $VARIABLES expanded), this interpreter as `python`, from `cwd`."""
    line = command.replace("python -m", f"{sys.executable} -m", 1) + "".join(f" {a}" for a in appended)
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    [page_command] = [c for c in COMMANDS if c.text.startswith(command)]
    readme = environment(page_command, {"PYTHONPATH": str(REPO)})
    return run_in_own_session(["bash", "-c", line], cwd=cwd, timeout=900,
                              env={**base, **readme, "PYTHONUNBUFFERED": "1", **RAY_CLIENT_ENV, **env})


def test_the_page_shows_a_local_an_existing_and_a_kuberay_command():
    assert "launcher.ray.address" not in LOCAL and "launcher.ray.address=$RAY_HEAD" in EXISTING
    assert KUBERAY.startswith("python -m framework.k8s --kind rayjob ")


def test_a_local_ray_instance_survives_a_killed_worker_with_the_uninterrupted_losses(tmp_path, trained_run):
    """The page's local command: rank 1 kills itself at step 6 of the first attempt; Ray (FailureConfig,
    max_failures=1) starts the group again, which resumes from step 4's checkpoint."""
    env = {"FRAMEWORK_FAULT": "step:6:rank=1:attempt=0",
           "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}     # Ray's controller polls often: steps are milliseconds apart
    proc = shell(LOCAL, tmp_path, env, *FAST, "checkpoint.enabled=true", "checkpoint.interval=4",
                 "launcher.max_restarts=1", "hydra.run.dir=run")
    check_ok(proc)
    said = proc.stdout + proc.stderr
    assert "fault injected: rank 1 kills itself at step:6 (attempt 0)" in said
    assert f"resuming from {tmp_path / 'run' / 'checkpoints' / 'step_00000004'}" in said
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == list(range(1, 9))
    assert max_rel_diff(losses(trained_run("parallel=ddp")), losses(tmp_path / "run")) <= EXACT


def test_the_kuberay_command_prints_a_rayjob_its_crd_accepts(tmp_path):
    proc = shell(KUBERAY, tmp_path, {}, "trainer.max_steps=2")
    check_ok(proc)
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayJob"]
    jsonschema.validate(docs[1], RAYJOB_SCHEMA)
