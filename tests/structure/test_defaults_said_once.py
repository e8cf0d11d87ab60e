"""Each default is said once, in its dataclass.

No dataclass in framework/ declares a field twice (the later declaration silently wins, so two
defaults or two comments can drift apart unnoticed).

A yaml under conf/ says only what differs. It names its schema in its defaults list (conf/config.yaml:
`config_schema`; a group option: `/schema/<group>/<name>@_here_`), and every leaf key it sets must hold
a value other than that schema's default (a MISSING default counts as differing: the yaml supplies it),
unless the key is the choice the option exists to make:
  - `_target_` anywhere: it names the class;
  - in conf/model/: the architecture keys (MODEL_SHAPE_KEYS): a size yaml states the whole published
    shape, so `n_layers: 12` stays even where it equals the dataclass's default; init_std does not.
Out of scope: yamls that name no schema of ours (conf/hydra/: Hydra's launcher packages;
conf/model/custom.yaml: only the user's class) and recipes (conf/recipe -> recipes/): every key of a
recipe is an explicit choice (framework/config/explicit.py), which a DeepSpeed JSON never overrides.
"""
from __future__ import annotations

import ast
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import framework
from framework.config.paths import CONFIG_DIR
from framework.compose.config_store import register_configs

ROOT = Path(framework.__file__).parent
MODEL_SHAPE_KEYS = {"dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "multiple_of",
                    "max_seq_len", "norm_eps", "rope_theta", "rope_scaling", "tie_embeddings"}


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def duplicate_fields(source: str) -> list[str]:
    """'Class.field' for every annotated field a dataclass in `source` declares more than once."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and _is_dataclass(node):
            seen = set()
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    name = stmt.target.id
                    if name in seen:
                        found.append(f"{node.name}.{name}")
                    seen.add(name)
    return found


def test_the_scan_finds_a_field_declared_twice():
    src = "from dataclasses import dataclass\n@dataclass\nclass C:\n    a: int = 1\n    b: int = 2\n    a: int = 3\n"
    assert duplicate_fields(src) == ["C.a"]
    assert duplicate_fields(src.replace("@dataclass\n", "")) == []


def test_no_dataclass_in_framework_declares_a_field_twice():
    dups = {str(p.relative_to(ROOT)): d for p in sorted(ROOT.rglob("*.py"))
            if (d := duplicate_fields(p.read_text()))}
    assert dups == {}


def _schema_name(option: dict) -> str | None:
    for entry in option.get("defaults", []):
        if entry == "config_schema":
            return "config_schema"
        if isinstance(entry, str) and entry.startswith("/schema/") and entry.endswith("@_here_"):
            return entry[1:-len("@_here_")]
    return None


def _leaves(node, prefix: str = ""):
    if not isinstance(node, dict) or not node:
        yield prefix, node
        return
    for key, value in node.items():
        yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))


def repeated_defaults(option: dict, schema, group: str) -> list[str]:
    """Keys `option` (a group yaml as a dict) sets to the value `schema` already holds, bar choices."""
    found = []
    for key, value in _leaves({k: v for k, v in option.items() if k not in ("defaults", "hydra")}):
        top = key.split(".")[0]
        if top == "_target_" or (group == "model" and top in MODEL_SHAPE_KEYS):
            continue
        if OmegaConf.is_missing(schema, key):
            continue
        default = OmegaConf.select(schema, key, throw_on_missing=False)
        if OmegaConf.is_config(default):
            default = OmegaConf.to_container(default)
        if default == value:
            found.append(f"{key}: {value!r}")
    return found


def test_the_scan_finds_a_repeated_default_and_spares_choices():
    schema = OmegaConf.create({"_target_": "C", "name": "???", "lr": 0.1, "betas": [0.9, 0.95],
                               "dim": 256, "init_std": 0.02})
    option = {"defaults": ["/schema/x/y@_here_"], "_target_": "C", "name": "a", "lr": 0.1,
              "betas": [0.9, 0.95], "dim": 256, "init_std": 0.02}
    assert repeated_defaults(option, schema, "optimizer") == ["lr: 0.1", "betas: [0.9, 0.95]",
                                                              "dim: 256", "init_std: 0.02"]
    assert repeated_defaults(option, schema, "model") == ["lr: 0.1", "betas: [0.9, 0.95]", "init_std: 0.02"]
    assert repeated_defaults({**option, "lr": 0.2, "betas": [0.9, 0.99]}, schema, "optimizer") == \
        ["dim: 256", "init_std: 0.02"]


def test_every_conf_yaml_sets_only_what_differs_from_its_schema():
    register_configs()
    store = ConfigStore.instance()
    checked, repeats = [], {}
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        rel = path.relative_to(CONFIG_DIR)
        if rel.parts[0] in ("hydra", "recipe"):
            continue
        option = OmegaConf.to_container(OmegaConf.load(path))
        name = _schema_name(option)
        if name is None:
            continue
        checked.append(str(rel))
        group = rel.parts[0] if len(rel.parts) > 1 else ""
        if found := repeated_defaults(option, store.load(f"{name}.yaml").node, group):
            repeats[str(rel)] = found
    assert len(checked) > 30 and "config.yaml" in checked
    assert repeats == {}
