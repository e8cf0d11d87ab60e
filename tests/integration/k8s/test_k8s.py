"""`python -m framework.k8s`: TrainJob manifests validate against the kubeflow-trainer-api models, PyTorchJob
manifests against the PyTorchJob CRD schema; names are RFC 1035 labels; sweeps give one job per point."""
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubeflow_trainer_api.models.io_k8s_api_core_v1_config_map import IoK8sApiCoreV1ConfigMap
from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

from framework.k8s.manifests import rfc1035
from tests.harness.docs_commands import environment, run_by
from tests.harness.helpers import REPO, run_framework

FIXTURES = REPO / "tests" / "fixtures" / "k8s"
SCHEMA = json.loads((FIXTURES / "pytorchjob.kubeflow.org_v1.schema.json").read_text())
TINY = ["model=tiny", "parallel=fsdp", "zero=stage3", "trainer.global_batch_size=32", "trainer.micro_batch_size=2"]
LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def k8s(*args: str, env=None):
    return run_framework(list(args), module="framework.k8s", env=env)


def documents(proc) -> list[dict]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(yaml.safe_load_all(proc.stdout))


def same(model_cls, doc: dict) -> None:
    """Round-trip through the API model: a misspelt or misplaced field would be dropped and show here."""
    assert model_cls.from_dict(doc).to_dict() == doc


def test_trainjob_validates_against_the_trainer_api_models():
    docs = documents(k8s("--kind", "trainjob", "--image", "reg.example/fw:1", "--nodes", "2", "--gpus-per-node", "8",
                         "--volume-claim", "team-runs", *TINY, env={"NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}))
    cm, job = docs
    same(IoK8sApiCoreV1ConfigMap, cm)
    same(TrainerV1alpha1TrainJob, job)
    t = job["spec"]["trainer"]
    assert (job["apiVersion"], job["spec"]["runtimeRef"]["name"]) == ("trainer.kubeflow.org/v1alpha1", "torch-distributed")
    assert (t["numNodes"], t["numProcPerNode"], t["resourcesPerNode"]["limits"]["nvidia.com/gpu"]) == (2, 8, "8")
    assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in t["env"] and {"name": "NCCL_DEBUG", "value": "WARN"} in t["env"]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    volumes = pod["template"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "team-runs"}} in volumes
    assert {"name": "config", "configMap": {"name": cm["metadata"]["name"]}} in volumes
    shipped = yaml.safe_load(cm["data"]["config.yaml"])
    assert shipped["parallel"]["name"] == "fsdp" and shipped["zero"]["stage"] == 3 and shipped["model"]["dim"] == 32


def test_pytorchjob_validates_against_its_crd_schema():
    cm, job = documents(k8s("--kind", "pytorchjob", "--image", "reg.example/fw:1", "--nodes", "3", "--gpus-per-node", "4",
                            *TINY, "trainer.global_batch_size=24"))
    jsonschema.validate(job, SCHEMA)
    same(IoK8sApiCoreV1ConfigMap, cm)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"], job["spec"]["nprocPerNode"]) == (1, 2, "4")
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert specs["Master"]["restartPolicy"] == "ExitCode"      # retries 128-255: the requeue exit code is 143
    broken = {**job, "spec": {**job["spec"], "pytorchReplicaSpecs": {"Master": {**specs["Master"], "replicas": "one"}}}}
    with pytest.raises(jsonschema.ValidationError):     # the schema check is a real one
        jsonschema.validate(broken, SCHEMA)


def test_sweep_gives_one_rfc1035_job_per_point():
    docs = documents(k8s("--kind", "pytorchjob", "--image", "i", "--nodes", "2", "--name", "Llama_Sweep.v2", "-m",
                         "launcher.nproc_per_node=1", "model=tiny", "parallel=ddp", "trainer.micro_batch_size=8",
                         "optimizer.lr=1e-4,3e-4"))
    names = [d["metadata"]["name"] for d in docs]
    assert names == ["llama-sweep-v2-0-config", "llama-sweep-v2-0", "llama-sweep-v2-1-config", "llama-sweep-v2-1"]
    assert all(LABEL.match(n) for n in names)
    lrs = [yaml.safe_load(d["data"]["config.yaml"])["optimizer"]["lr"] for d in docs if d["kind"] == "ConfigMap"]
    assert lrs == [1e-4, 3e-4]
    for job in docs[1::2]:
        jsonschema.validate(job, SCHEMA)
        assert f"hydra.run.dir=/runs/{job['metadata']['name']}" in job["spec"]["pytorchReplicaSpecs"]["Master"][
            "template"]["spec"]["containers"][0]["command"]


def strict(schema):
    """The CRD schema as `kubectl apply --validate=strict` reads it: a field the schema does not name is an error
    (the API server would otherwise drop it silently), except where the schema keeps unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


RAYJOB_SCHEMA = strict(json.loads((FIXTURES / "rayjob.ray.io_v1.schema.json").read_text()))


def test_rayjob_validates_against_kuberays_crd_schema(capsys, monkeypatch):
    from framework.k8s.__main__ import main
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    main(["--kind", "rayjob", "--image", "reg.example/fw:1", "--nodes", "2", "--gpus-per-node", "4",
          "--volume-claim", "team-runs", *TINY])      # in this process: the manifest is all this test reads
    cm, job = yaml.safe_load_all(capsys.readouterr().out)
    jsonschema.validate(job, RAYJOB_SCHEMA)
    same(IoK8sApiCoreV1ConfigMap, cm)
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob") and spec["shutdownAfterJobFinishes"] is True
    assert spec["entrypoint"].startswith("python -m framework --config-path /etc/framework --config-name config ")
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "4" and {"name": "NCCL_DEBUG", "value": "WARN"} in worker["env"]
    for pod in (head, group["template"]["spec"]):      # the config on the driver's pod, the run dir on every pod
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "team-runs"}} in pod["volumes"]
        assert {"name": "config", "configMap": {"name": cm["metadata"]["name"]}} in pod["volumes"]
    shipped = yaml.safe_load(cm["data"]["config.yaml"])
    assert shipped["launcher"]["engine"] == "ray" and shipped["launcher"]["nproc_per_node"] == 8
    misspelt = {**job, "spec": {**spec, "shutdownAfterJobFinish": True}}
    with pytest.raises(jsonschema.ValidationError):     # the schema check is a real one
        jsonschema.validate(misspelt, RAYJOB_SCHEMA)


@pytest.mark.parametrize("raw", ["My_Job", "7up", "a" * 80, "--x--", "ÜBER job"])
def test_rfc1035_labels(raw):
    assert LABEL.match(rfc1035(raw))


def test_an_invalid_config_is_refused_before_any_manifest():
    proc = k8s("--kind", "trainjob", "--image", "i", "--nodes", "2", "--gpus-per-node", "8", "parallel=fsdp", "zero=none")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("error: zero: parallel=fsdp does not do zero=none")


def _docs_k8s_commands() -> list[tuple[list[str], dict]]:
    """(arguments, README's environment plus the page's extras) of each command the page shows."""
    commands = run_by(__file__)
    assert len(commands) == 2
    return [(c.text.split("|")[0].split()[3:], environment(c)) for c in commands]


@pytest.mark.parametrize("args,env", _docs_k8s_commands(), ids=["trainjob", "pytorchjob-sweep"])
def test_docs_k8s_commands_print_valid_manifests(args, env):
    docs = documents(k8s(*args, env=env))
    for doc in docs:
        if doc["kind"] == "PyTorchJob":
            jsonschema.validate(doc, SCHEMA)
        elif doc["kind"] == "TrainJob":
            same(TrainerV1alpha1TrainJob, doc)
        else:
            same(IoK8sApiCoreV1ConfigMap, doc)
    assert len(docs) in (2, 4)
