"""A saved config -- the config.yaml in a checkpoint step dir -- read as data, never as code.

Whoever wrote the file, reading it runs nothing and reads nothing of the reader's environment. It is parsed as
plain YAML (yaml.safe_load) and refused in one line (`SavedConfigError`: `<file>: <key>: what is wrong`) where
it holds
- an interpolation (`${...}`) anywhere: a run resolves its config before saving it, and resolving one now
  (`${oc.env:AWS_SECRET_ACCESS_KEY}`) would copy the reader's secrets into whatever it writes;
- Hydra's instantiation keys (`_target_`, `_args_`, `_partial_`, ...) anywhere but model._target_ and
  optimizer._target_, or a YAML alias;
- a model._target_ that is not one of the framework's model classes (the families of framework/models/spec.py
  SPECS), or an optimizer._target_ not one of the schema's optimizers, unless the reader trusts the
  checkpoint's code (TRUST_FLAG: any class may then be imported; interpolations and nested `_target_` are still
  refused);
- in the sections the readers use (model, against its family's schema; lora; data; precision): a value of the
  wrong type, a key the schema does not know, a choice outside its set, a missing value.
Those sections come back typed and read-only; nothing else of the file is passed on. A model=hf checkpoint
never makes transformers run code from a dir it names (framework/models/hf: trust_remote_code=False).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework import storage
from framework.checkpoint.names import CONFIG
from framework.config.choices import check_choices
from framework.config.schema import DataConfig, LoraConfig, OptimizerConfig, PrecisionConfig
from framework.errors import ConfigError
from framework.models.spec import SPECS, ModelSpec, spec_for, spec_named

TRUST_FLAG = "--trust-checkpoint-code"
TRUST_HELP = ("lifts one refusal only: import model._target_ from the checkpoint's config.yaml even where it is not "
              "one of the framework's model classes (that class's code then runs). Interpolations (${...}) and "
              "nested _target_ in the file are refused either way, and transformers never runs a model dir's code")
#: Hydra's keys that make instantiate import, call or reshape something
INSTANTIATE_KEYS = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_")
#: where a saved config names a class (the rest of the file names none)
CLASS_KEYS = ("model._target_", "optimizer._target_")
#: the typed sections a reader gets back, besides the model (typed by its family's schema)
SECTIONS = {"lora": LoraConfig, "data": DataConfig, "precision": PrecisionConfig}


class SavedConfigError(ValueError):
    """A saved config that is refused: `<file>: <key>: what is wrong`; reported as one line, exit code 2."""


@dataclass(frozen=True)
class SavedConfig:
    spec: ModelSpec
    model: DictConfig           # typed by spec.config_schema() (untyped for a trusted class of no family)
    lora: DictConfig
    data: DictConfig
    precision: DictConfig       # the exporter writes the weights in precision.store_dtype


def read_saved_config(step_dir: str, trust_code: bool = False) -> SavedConfig:
    """The checked sections of a checkpoint step dir's config.yaml (a path or a URL)."""
    tree, where = _parsed(step_dir)
    _check_class(tree, "optimizer._target_", _optimizer_targets(), where, trust_code)
    spec, model = checked_model(tree.get("model"), where, trust_code)
    if "data" not in tree:
        raise SavedConfigError(f"{where}: data: missing; a saved config names the data its model was trained on")
    return SavedConfig(spec, model, **{name: _typed(tree.get(name, {}), schema, name, where)
                                       for name, schema in SECTIONS.items()})


def saved_section(step_dir: str, name: str) -> DictConfig:
    """One typed section of SECTIONS, the file checked as a whole but its model left alone: for a reader that
    needs no more (the state reader: lora.base_dtype)."""
    tree, where = _parsed(step_dir)
    return _typed(tree.get(name, {}), SECTIONS[name], name, where)


def _parsed(step_dir: str) -> tuple[dict, str]:
    """(the file as plain data, refused where it holds code or interpolations; its path)."""
    where = storage.join(step_dir, CONFIG)
    try:
        text = storage.read_text(where)
    except FileNotFoundError:
        raise SavedConfigError(f"{where}: no such file; the step dir holds no saved config") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise SavedConfigError(f"{where}: not YAML" + (f" (line {mark.line + 1})" if mark else "")) from None
    if not isinstance(tree, dict):
        raise SavedConfigError(f"{where}: not a mapping of config sections")
    refuse_code_and_interpolations(tree, where)
    return tree, where


def refuse_code_and_interpolations(tree, where: str, key: str = "", seen: Optional[set] = None) -> None:
    """Refuse an interpolation anywhere in `tree`, an instantiation key outside CLASS_KEYS, a YAML alias."""
    seen = set() if seen is None else seen
    if isinstance(tree, (dict, list)):
        if id(tree) in seen:
            raise SavedConfigError(f"{where}: {key or '<top>'}: a YAML alias, which a saved config never holds")
        seen.add(id(tree))
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for name, value in items:
        full = f"{key}.{name}" if key else str(name)
        if name in INSTANTIATE_KEYS and full not in CLASS_KEYS:
            raise SavedConfigError(f"{where}: {full}: Hydra's {name} is refused here: a saved config names no code "
                                   f"to instantiate but {' and '.join(CLASS_KEYS)}")
        refuse_code_and_interpolations(value, where, full, seen)
    if isinstance(tree, str) and "${" in tree:
        raise SavedConfigError(f"{where}: {key}: holds an interpolation (${{...}}), which is never resolved from a "
                               f"saved config (a run saves its config resolved)")


def checked_model(model, where: str, trust_code: bool = False) -> tuple[ModelSpec, DictConfig]:
    """(spec, the model section typed by its family's schema, read-only) of a saved `model` mapping; also what
    an export's config.json gives (framework.generate), checked the same way."""
    if not isinstance(model, dict) or not isinstance(model.get("_target_"), str):
        raise SavedConfigError(f"{where}: model._target_: missing; the model section names its class")
    refuse_code_and_interpolations(model, where, "model")
    families = _model_targets()
    _check_class({"model": model}, "model._target_", families, where, trust_code)
    spec = families.get(model["_target_"])
    if spec is None:            # a class of the user's, trusted: its family by its bases, or none
        try:
            spec = spec_for(model)
        except (ImportError, AttributeError, ValueError, TypeError) as e:
            raise SavedConfigError(f"{where}: model._target_: {model['_target_']} cannot be imported "
                                   f"({type(e).__name__})") from None
    schema = spec.config_schema()
    if schema is None:
        typed = OmegaConf.create(model)
        OmegaConf.set_readonly(typed, True)
        return spec, typed
    return spec, _typed(model, schema, "model", where)


def _typed(section, schema: type, name: str, where: str) -> DictConfig:
    """`section` over its schema's defaults: a key it does not know, a value of another type, a choice outside
    its set or a value left missing is refused."""
    if not isinstance(section, dict):
        raise SavedConfigError(f"{where}: {name}: not a mapping")
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), section)
        check_choices(typed)
    except OmegaConfBaseException as e:
        raise SavedConfigError(f"{where}: {name}.{e.full_key}: {str(e.msg).splitlines()[0]}") from None
    except ConfigError as e:
        raise SavedConfigError(f"{where}: {name}.{e}") from None
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        raise SavedConfigError(f"{where}: {name}.{missing[0]}: missing")
    OmegaConf.set_readonly(typed, True)
    return typed


def _check_class(tree: dict, key: str, known, where: str, trust_code: bool) -> None:
    section, _, field = key.partition(".")
    value = tree.get(section, {}).get(field) if isinstance(tree.get(section), dict) else None
    if value is None or value in known or trust_code:
        return
    raise SavedConfigError(f"{where}: {key}: {value!r} is not one of the framework's classes "
                           f"({', '.join(sorted(known))}); a checkpoint's config runs no code of its own unless you "
                           f"pass {TRUST_FLAG}")


def _default(schema: type, name: str):
    return next(f.default for f in dataclasses.fields(schema) if f.name == name)


def _model_targets() -> dict[str, ModelSpec]:
    """model._target_ of each registered family (its schema's default) -> its spec."""
    specs = [spec_named(name) for name in SPECS]
    return {_default(spec.config_schema(), "_target_"): spec for spec in specs if spec.config_schema()}


def _optimizer_targets() -> set[str]:
    return {_default(schema, "_target_") for schema in OptimizerConfig.__subclasses__()}
