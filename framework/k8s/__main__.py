"""`python -m framework.k8s --kind trainjob|pytorchjob|rayjob --image IMAGE --nodes N --gpus-per-node G [-m] [overrides]`

Composes and validates the config exactly as `python -m framework OVERRIDES` would, for a world of
N x processes-per-node, and prints the manifests that run it (one ConfigMap + job per sweep point with -m; a
Secret before them where the config holds credentials, which the ConfigMap then does not).
A RayJob's nodes are its worker group's pods (the head runs the driver); its config says launcher.engine=ray.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from framework import exit_codes
from framework.compose.config_store import register_configs
from framework.config.derive import derive
from framework.config.paths import CONFIG_DIR
from framework.config.validate import validate
from framework.errors import ConfigError
from framework.launch import admission
from framework.redact import redacted
from framework.k8s.manifests import (CONFIG_SUFFIX, KIND_OVERRIDES, KINDS, SECRET_SUFFIX, JobSpec, config_map,
                                     rfc1035, secret, secrets_out)
from framework.strategies.registry import strategy_class

PASSED_THROUGH = ("NCCL_",)     # the cluster's network tuning travels with the job


class _Dumper(yaml.SafeDumper):
    """Plain YAML for kubectl: no anchors, multi-line strings (the config) as literal blocks."""

    def ignore_aliases(self, data) -> bool:
        return True


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                             style="|" if "\n" in s else None))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m framework.k8s", description=__doc__.split("\n\n")[1])
    p.add_argument("--kind", choices=sorted(KINDS), required=True)
    p.add_argument("--image", required=True, help="a container image with this framework installed")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=0, help="0: CPU pods running launcher.nproc_per_node each")
    p.add_argument("--name", default="framework", help="job name (made RFC 1035-safe; sweep points get -0, -1, ...)")
    p.add_argument("--volume-claim", default="framework-runs", help="PersistentVolumeClaim for run dirs and checkpoints")
    p.add_argument("--runs-path", default="/runs", help="where that volume is mounted")
    p.add_argument("-m", "--multirun", action="store_true", help="one manifest per sweep point")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def sweep_points(overrides: list[str], multirun: bool) -> list[list[str]]:
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    return [list(point) for point in itertools.product(*choices)]


def manifests_for(args: argparse.Namespace, overrides: list[str], name: str, compose_fn) -> list[dict]:
    if args.nodes <= 0:
        raise ConfigError("--nodes", f"must be positive, got {args.nodes}")
    cfg = compose_fn(overrides)
    cls = strategy_class(cfg.parallel.name)
    procs = args.gpus_per_node or cfg.launcher.nproc_per_node or max(1, cls.workers_wanted(cfg) // args.nodes)
    if args.kind in KIND_OVERRIDES:
        cfg = compose_fn([*overrides, *KIND_OVERRIDES[args.kind](args.nodes, procs)])
    derive(cfg, args.nodes * procs, cls)
    validate(cfg, args.nodes * procs, cls)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(PASSED_THROUGH)}
    config, secrets = secrets_out(OmegaConf.to_container(cfg, resolve=True))
    spec = JobSpec(name, args.image, args.nodes, procs, args.gpus_per_node, rfc1035(args.volume_claim, 253),
                   args.runs_path.rstrip("/") or "/", env, tuple(secrets))
    shipped = config_map(spec, OmegaConf.to_yaml(OmegaConf.create(config)))
    return [*([secret(spec, secrets)] if secrets else []), shipped, KINDS[args.kind](spec)]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", admission.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", admission.hydra_output_subdir, replace=True)
    points = sweep_points(args.overrides, args.multirun)
    base = rfc1035(args.name, 63 - len(f"-{len(points)}{max(CONFIG_SUFFIX, SECRET_SUFFIX, key=len)}"))
    docs = []
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            def compose_fn(overrides):
                return compose(config_name="config", overrides=overrides)
            for i, point in enumerate(points):
                docs += manifests_for(args, point, f"{base}-{i}" if args.multirun else base, compose_fn)
    except ConfigError as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        sys.exit(exit_codes.USAGE)
    except Exception as e:   # Hydra's own composition errors: an unknown key or group option
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            print(f"error: {redacted(str(e).splitlines()[0])}", file=sys.stderr)
            sys.exit(exit_codes.USAGE)
        raise
    yaml.dump_all(docs, sys.stdout, Dumper=_Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
    main()
