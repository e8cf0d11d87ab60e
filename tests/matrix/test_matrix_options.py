"""tests/matrix/crossed.py holds the whole schema: every field the config declares is crossed by the combination
matrix or listed with the reason it is not, each crossed field starts at its default, and every model family is
crossed at its smallest member or listed. A new option thus enters the matrix, or says why not."""
import dataclasses
import typing

from framework.config.schema import (AdamWConfig, AutoParallelConfig, BF16AdamWConfig, Config, LowBitAdamWConfig,
                                     MuonConfig, SGDConfig, WSDConfig)
from framework.models.spec import SPECS, spec_named
from framework.objectives.registry import DEFAULT, OBJECTIVES, objective_class
from framework.strategies.registry import STRATEGIES, strategy_class
from tests.matrix.crossed import CROSSED, NOT_CROSSED, OBJECTIVES_NOT_CROSSED, SMALLEST


def _fields(schema: type, prefix: str, found: dict) -> None:
    """config path -> the defaults the schemas give it (a nested dataclass is walked into)."""
    for f in dataclasses.fields(schema):
        key = prefix + f.name
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(value):
            _fields(type(value), key + ".", found)
        else:
            found.setdefault(key, []).append(value)


def schema_fields() -> dict:
    found: dict = {}
    for name, hint in typing.get_type_hints(Config).items():
        if dataclasses.is_dataclass(hint):
            _fields(hint, name + ".", found)
        else:
            found.setdefault(name, [])           # a group of options (parallel, model, optimizer)
    for name in STRATEGIES:
        _fields(strategy_class(name).options, "parallel.", found)
    _fields(AutoParallelConfig, "parallel.", found)
    for schema in (AdamWConfig, SGDConfig, MuonConfig, LowBitAdamWConfig, BF16AdamWConfig):
        _fields(schema, "optimizer.", found)
    _fields(WSDConfig, "scheduler.", found)
    for name in SPECS:
        schema = spec_named(name).config_schema()
        if schema is not None:
            _fields(schema, "model.", found)
    for name in OBJECTIVES:
        _fields(objective_class(name).options, "objective.", found)
    return found


def test_every_field_is_crossed_or_says_why_not():
    fields = schema_fields()
    neither = sorted(set(fields) - set(CROSSED) - set(NOT_CROSSED))
    assert not neither, f"cross these in tests/matrix/crossed.py, or say there why not: {neither}"
    both = sorted(set(CROSSED) & set(NOT_CROSSED))
    assert not both, f"crossed and not crossed at once: {both}"
    gone = sorted((set(CROSSED) | set(NOT_CROSSED)) - set(fields))
    assert not gone, f"no schema declares these any more: {gone}"


def test_each_crossed_field_starts_at_a_default_its_schemas_give():
    fields = schema_fields()
    for key, values in CROSSED.items():
        first = list(values[0]) if isinstance(values[0], tuple) else values[0]
        assert first in fields[key], f"{key}: the matrix's first value {first!r}, the schemas' {fields[key]}"
        assert len(set(values)) == len(values) > 1, f"{key}: {values}"


def test_every_objective_left_out_of_the_axis_is_one_the_registry_has():
    gone = sorted(set(OBJECTIVES_NOT_CROSSED) - set(OBJECTIVES))
    assert not gone, f"tests/matrix/crossed.py leaves out objectives no registry has: {gone}"
    assert DEFAULT not in OBJECTIVES_NOT_CROSSED


def test_every_model_family_is_crossed_or_says_why_not():
    assert set(SMALLEST) == set(SPECS), f"families without a smallest member: {set(SPECS) - set(SMALLEST)}"
