"""docs/how-to/ray.md: every `python -m framework` command on the page runs as written, from a directory outside
the checkout: on a Ray instance the job starts itself (shortened to 2 steps), and the KubeRay RayJob it prints
validates against KubeRay's CRD schema. The page's command for an existing cluster runs in test_ray_engine, on the
Ray cluster that module starts."""
import os
import sys

import jsonschema
import yaml

from tests.helpers import REPO, check_ok, losses, run_in_own_session
from tests.servers import RAY_CLIENT_ENV, doc_commands
from tests.test_k8s import RAYJOB_SCHEMA

PAGE = REPO / "docs" / "how-to" / "ray.md"
LOCAL, EXISTING, KUBERAY = doc_commands(PAGE)


def shell(command: str, cwd, env: dict, *appended: str):
    """The page's line through bash (its $VARIABLES expanded), this interpreter as `python`, from `cwd`."""
    line = command.replace("python -m", f"{sys.executable} -m", 1) + "".join(f" {a}" for a in appended)
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return run_in_own_session(["bash", "-c", line], cwd=cwd, timeout=900,
                              env={**base, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **RAY_CLIENT_ENV, **env})


def test_the_page_shows_a_local_an_existing_and_a_kuberay_command():
    assert "launcher.ray.address" not in LOCAL and "launcher.ray.address=$RAY_HEAD" in EXISTING
    assert KUBERAY.startswith("python -m framework.k8s --kind rayjob ")


def test_without_an_address_the_job_starts_a_ray_instance_of_its_own(tmp_path):
    proc = shell(LOCAL, tmp_path, {}, "trainer.max_steps=2")
    check_ok(proc)
    assert len(losses(next((tmp_path / "outputs").rglob("metrics.jsonl")).parent)) == 2


def test_the_kuberay_command_prints_a_rayjob_its_crd_accepts(tmp_path):
    proc = shell(KUBERAY, tmp_path, {}, "trainer.max_steps=2")
    check_ok(proc)
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "RayJob"]
    jsonschema.validate(docs[1], RAYJOB_SCHEMA)
