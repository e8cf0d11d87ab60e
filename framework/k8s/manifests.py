"""Kubernetes manifests for one resolved config: a ConfigMap holding it, and a TrainJob (Kubeflow Trainer v2)
or a PyTorchJob (training operator v1) whose pods run `python -m framework` on it, or a KubeRay RayJob whose
entrypoint runs it with launcher.engine=ray on the Ray cluster the RayJob brings up.

Kubeflow: every pod runs the same command; the operator's env (PET_* / RANK) tells the nodes apart and
framework.runtime.cluster_env turns it into a rendezvous. RayJob: the entrypoint runs once, on the head (the driver),
and Ray places the workers on the worker group's pods. The run dir (with its checkpoints, unless
checkpoint.dir names a bucket) lives on a volume the user names, mounted on every pod, so a restarted job
resumes with checkpoint.resume=auto.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from framework.redact import has_credentials

CONFIG_DIR = "/etc/framework"
CONFIG_VOLUME, RUNS_VOLUME = "config", "runs"
GPU = "nvidia.com/gpu"
RUNTIME = "torch-distributed"
TRAINER_CONTAINER = "node"      # the torch-distributed runtime's container and replicated job
PYTORCHJOB_CONTAINER = "pytorch"
SECRET_ENV_PREFIX = "FRAMEWORK_SECRET_"
#: the names a job's objects take after the job's own (the longest bounds the job's name)
CONFIG_SUFFIX, SECRET_SUFFIX = "-config", "-secrets"


def rfc1035(name: str, limit: int = 63) -> str:
    """A DNS label: lowercase letters, digits and '-', starting with a letter, at most `limit` long."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    label = re.sub(r"-{2,}", "-", label)
    if not label or not label[0].isalpha():
        label = f"job-{label}".rstrip("-")
    return label[:limit].rstrip("-")


@dataclass
class JobSpec:
    name: str
    image: str
    nodes: int
    procs_per_node: int
    gpus_per_node: int
    volume_claim: str
    runs_path: str
    env: dict[str, str]
    secret_keys: tuple[str, ...] = ()     # environment variables the pods take from the job's Secret

    @property
    def config_map(self) -> str:
        return rfc1035(f"{self.name}{CONFIG_SUFFIX}")

    @property
    def secret(self) -> str:
        return rfc1035(f"{self.name}{SECRET_SUFFIX}")

    def command(self) -> list[str]:
        return ["python", "-m", "framework", "--config-path", CONFIG_DIR, "--config-name", "config",
                f"hydra.run.dir={self.runs_path}/{self.name}", "checkpoint.resume=auto"]

    def env_list(self) -> list[dict]:
        return [{"name": k, "value": v} for k, v in sorted(self.env.items())] + \
            [{"name": k, "valueFrom": {"secretKeyRef": {"name": self.secret, "key": k}}} for k in self.secret_keys]

    def resources(self) -> dict | None:
        return {"limits": {GPU: str(self.gpus_per_node)}} if self.gpus_per_node else None

    def volumes(self) -> list[dict]:
        return [{"name": RUNS_VOLUME, "persistentVolumeClaim": {"claimName": self.volume_claim}},
                {"name": CONFIG_VOLUME, "configMap": {"name": self.config_map}}]

    def volume_mounts(self) -> list[dict]:
        return [{"name": RUNS_VOLUME, "mountPath": self.runs_path},
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]


def secrets_out(config, key: str = "") -> tuple[object, dict[str, str]]:
    """(the config with each value that holds credentials replaced by `${oc.env:<variable>}`, {variable: value})."""
    if isinstance(config, dict):
        pairs = [secrets_out(value, f"{key}.{name}" if key else str(name)) for name, value in config.items()]
        return dict(zip(config, (p[0] for p in pairs))), {k: v for p in pairs for k, v in p[1].items()}
    if isinstance(config, list):
        pairs = [secrets_out(value, f"{key}.{i}") for i, value in enumerate(config)]
        return [p[0] for p in pairs], {k: v for p in pairs for k, v in p[1].items()}
    if has_credentials(config):
        variable = SECRET_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", key).upper()
        return f"${{oc.env:{variable}}}", {variable: config}
    return config, {}


def secret(spec: JobSpec, values: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": spec.secret}, "type": "Opaque",
            "stringData": values}


def config_map(spec: JobSpec, config_yaml: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec.config_map},
            "data": {"config.yaml": config_yaml}}


def train_job(spec: JobSpec) -> dict:
    trainer = {"image": spec.image, "command": spec.command(), "numNodes": spec.nodes,
               "numProcPerNode": spec.procs_per_node}
    if spec.env_list():
        trainer["env"] = spec.env_list()
    if spec.resources():
        trainer["resourcesPerNode"] = spec.resources()
    pod = {"spec": {"volumes": spec.volumes(),
                    "containers": [{"name": TRAINER_CONTAINER, "volumeMounts": spec.volume_mounts()}]}}
    patch = {"manager": "framework.k8s", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": TRAINER_CONTAINER, "template": {"spec": {"template": pod}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": spec.name},
            "spec": {"runtimeRef": {"name": RUNTIME}, "trainer": trainer, "runtimePatches": [patch]}}


def pytorch_job(spec: JobSpec) -> dict:
    container = {"name": PYTORCHJOB_CONTAINER, "image": spec.image, "command": spec.command(),
                 "volumeMounts": spec.volume_mounts()}
    if spec.env_list():
        container["env"] = spec.env_list()
    if spec.resources():
        container["resources"] = spec.resources()

    def replicas(n: int) -> dict:
        # ExitCode: the operator restarts pods that exit 128-255, which includes our requeue code (143)
        return {"replicas": n, "restartPolicy": "ExitCode",
                "template": {"spec": {"containers": [container], "volumes": spec.volumes()}}}
    specs = {"Master": replicas(1)}
    if spec.nodes > 1:
        specs["Worker"] = replicas(spec.nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": spec.name},
            "spec": {"nprocPerNode": str(spec.procs_per_node), "pytorchReplicaSpecs": specs}}


RAY_HEAD, RAY_WORKER, RAY_WORKERS = "ray-head", "ray-worker", "workers"


def ray_job(spec: JobSpec) -> dict:
    def pod(container: str, resources: dict | None) -> dict:
        main = {"name": container, "image": spec.image, "volumeMounts": spec.volume_mounts()}
        if spec.env_list():
            main["env"] = spec.env_list()
        if resources:
            main["resources"] = resources
        return {"spec": {"containers": [main], "volumes": spec.volumes()}}
    # The head runs the driver and Ray's controller, not training workers (num-cpus 0); each worker pod holds
    # procs_per_node of them: its GPUs, or that many CPUs.
    workers = {"groupName": RAY_WORKERS, "replicas": spec.nodes, "minReplicas": spec.nodes,
               "maxReplicas": spec.nodes, "rayStartParams": {} if spec.gpus_per_node else
               {"num-cpus": str(spec.procs_per_node)}, "template": pod(RAY_WORKER, spec.resources())}
    cluster = {"headGroupSpec": {"rayStartParams": {"num-cpus": "0"}, "template": pod(RAY_HEAD, None)},
               "workerGroupSpecs": [workers]}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": spec.name},
            "spec": {"entrypoint": shlex.join(spec.command()), "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": cluster}}


KINDS = {"trainjob": train_job, "pytorchjob": pytorch_job, "rayjob": ray_job}
#: what each kind adds to the config: a RayJob's entrypoint runs the job as one Ray Train run of every worker
KIND_OVERRIDES = {"rayjob": lambda nodes, procs: ["launcher.engine=ray", f"launcher.nproc_per_node={nodes * procs}"]}
