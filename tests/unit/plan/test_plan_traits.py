"""The planner asks a strategy's class what it shards and keeps, never its name: a strategy written in
one file (here, this test file) and registered is planned, hinted and weighed by parallel=auto with no
planner edit. Each one below mirrors a built-in strategy's traits under another name, so its plans must
equal the built-in's number for number. No process group, no worker: shapes on the meta device only."""
import ast
from dataclasses import dataclass, field

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from framework.config.paths import CONFIG_DIR
from framework.config.schema import ParallelConfig
from tests.harness.helpers import derive_and_validate
from framework.compose.config_store import register_configs
from framework.parallel.mesh import ParallelDims
from framework.plan.auto import candidates, rank_layouts
from framework.plan.check import _variants
from framework.plan.hardware import device_named
from framework.plan.planner import make_plan
from framework.plan.shapes import meta_model
from framework.strategies import registry
from framework.strategies.torch_strategy import TorchTraits
from framework.strategies.traits import ZERO_SHARDS, AutoLayout
from framework.strategies.registry import all_strategy_classes, strategy_class
from tests.harness.helpers import REPO

SMALL = ["model=tiny", "data.seq_len=64", "trainer.global_batch_size=16", "planner.device=h100"]


@dataclass
class ReplicaOptions(ParallelConfig):
    name: str = "replicas"
    gradient_as_bucket_view: bool = False


class Replicas(TorchTraits):
    """Whole replicas whose gradients sync once a step; zero=stage1 partitions the optimizer states."""
    name = "replicas"
    options = ReplicaOptions
    zero_support = {0: None, 1: None, 2: "not here", 3: "not here"}
    precisions = ("fp32", "bf16")
    activation_checkpointing = ("none", "full", "layer")
    machinery = 1

    @classmethod
    def gradient_copy(cls, cfg) -> bool:
        return not cfg.parallel.gradient_as_bucket_view

    @classmethod
    def auto_layouts(cls, cfg, world_size, per_node):
        return [AutoLayout(z, (), world_size) for z in cls.accepted_zero_stages()] if world_size > 1 else []


@dataclass
class UnitOptions(ParallelConfig):
    name: str = "units"
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    wrap_classes: list = field(default_factory=list)


class Units(TorchTraits):
    """FSDP2-style units, gradients reduce-scattered every micro-batch."""
    name = "units"
    options = UnitOptions
    zero_support = {0: "no", 1: "no", 2: None, 3: None}
    precisions = ("fp32", "bf16")
    activation_checkpointing = ("none", "full", "layer")
    dp_sharding = "unit"
    data_parallel_dims = ("dp_replicate", "dp_shard")
    zero_shards = {2: ZERO_SHARDS[3]}
    reduces_every_micro_batch = True
    machinery = 2
    precision_autocast = False

    @classmethod
    def casts_weights(cls, cfg, world_size):
        return True

    @classmethod
    def keeps_gathered(cls, stage):
        return stage != 3

    @classmethod
    def mesh_dims(cls, cfg, world_size):
        return ParallelDims.from_config(cfg.parallel, world_size)

    @classmethod
    def auto_layouts(cls, cfg, world_size, per_node):
        if world_size == 1:
            return []
        return [AutoLayout(z, (("dp_replicate", 1), ("dp_shard", world_size)), world_size)
                for z in cls.accepted_zero_stages()]


TWINS = {"replicas": (Replicas, "ddp"), "units": (Units, "fsdp")}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    for name, (cls, _) in TWINS.items():
        monkeypatch.setitem(registry.STRATEGIES, name, f"{__name__}:{cls.__name__}")


def _config(*overrides):
    register_configs()
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=SMALL + list(overrides))
    OmegaConf.set_struct(cfg, False)
    return cfg


def _as(cfg, name):
    """The same job under strategy `name` (its own options, the layout's degrees kept)."""
    twin = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    parallel = OmegaConf.to_container(OmegaConf.structured(strategy_class(name).options), resolve=True)
    parallel.update({k: v for k, v in twin.parallel.items() if k in parallel and k != "name"})
    twin.parallel = parallel
    return twin


def _numbers(plan):
    out = plan.as_json()
    out["layout"] = out["layout"].split(" ", 1)[1]      # all but parallel=<name>
    return out


@pytest.mark.parametrize("twin,overrides,world", [
    ("replicas", ["parallel=ddp"], 4),
    ("replicas", ["parallel=ddp", "zero=stage1", "precision=bf16"], 4),
    ("replicas", ["parallel=ddp", "zero=stage1", "parallel.gradient_as_bucket_view=true"], 2),
    ("units", ["parallel=fsdp", "zero=stage2"], 4),
    ("units", ["parallel=fsdp", "zero=stage2", "precision=bf16"], 4),
    ("units", ["parallel=fsdp", "zero=stage3", "parallel.dp_replicate=2", "trainer.micro_batch_size=2"], 4),
])
def test_a_strategy_registered_from_its_own_file_is_planned_as_the_built_in_it_mirrors(twin, overrides, world):
    cfg = _config(*overrides)
    derive_and_validate(cfg, world, strategy_class(cfg.parallel.name))
    mine = _as(cfg, twin)
    derive_and_validate(mine, world, strategy_class(twin))
    device = device_named("h100")
    built_in, planned = make_plan(cfg, world, device, world), make_plan(mine, world, device, world)
    assert planned.layout.describe().startswith(f"parallel={twin} ")
    assert _numbers(planned) == _numbers(built_in)


def test_parallel_auto_weighs_registered_strategies_as_the_built_ins_they_mirror():
    cfg = _config("parallel=auto")
    device = device_named("h100")
    ours = rank_layouts(_with_strategies(cfg, ["replicas", "units"]), 4, device, 4)
    built_in = rank_layouts(_with_strategies(cfg, ["ddp", "fsdp"]), 4, device, 4)
    rename = {twin: name for twin, (_, name) in TWINS.items()}
    assert [(rename[c.strategy], c.zero, c.parallel, c.ac, c.micro_batch) for c, _ in ours] == \
        [(c.strategy, c.zero, c.parallel, c.ac, c.micro_batch) for c, _ in built_in]
    assert [_numbers(p) for _, p in ours] == [_numbers(p) for _, p in built_in]
    assert {c.strategy for c in candidates(cfg, 1, 1, ["replicas", "units"])} == set()   # a world of one: neither


def _with_strategies(cfg, names):
    trial = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    trial.parallel.strategies = names
    return trial


def test_units_kept_gathered_from_forward_to_backward_are_planned_whole_at_once():
    # FSDP2's zero=stage2 (reshard_after_forward=False) holds every block's gathered parameters when
    # backward starts; stage3 frees each after its forward and holds one or two at a time
    world, device = 4, device_named("h100")
    stage2, stage3 = (make_plan(_config("parallel=fsdp", f"zero=stage{z}", "model.n_layers=8"), world, device, world)
                      for z in (2, 3))
    whole = sum(p.numel() for p in meta_model(_config("model.n_layers=8")).parameters()) * 4   # fp32 gathers
    assert stage2.per_rank_bytes["buffers"] - stage3.per_rank_bytes["buffers"] > 0.5 * whole
    assert stage2.per_rank_bytes["total"] > stage3.per_rank_bytes["total"]


def test_the_cheapest_fit_hint_takes_the_next_zero_stage_the_strategy_accepts():
    units = _as(_config("parallel=fsdp", "zero=stage2"), "units")
    assert "zero=stage3" in [text for text, _ in _variants(units)]
    replicas = _as(_config("parallel=ddp", "zero=stage1"), "replicas")
    assert not [text for text, _ in _variants(replicas) if text.startswith("zero=")]


def test_every_strategy_shards_only_what_its_accepted_stages_say():
    for name, cls in {**all_strategy_classes(), **{n: c for n, (c, _) in TWINS.items()}}.items():
        assert set(cls.zero_shards) <= set(cls.accepted_zero_stages()), name
        assert cls.dp_sharding in ("replicate", "unit", "flat"), name
        assert set(cls.shards(0)) <= {"optimizer", "grads", "params"}, name


def test_the_planner_names_no_strategy():
    """plan/ reads traits; a strategy's name in it would be a rule a new strategy cannot reach."""
    names = set(registry.STRATEGIES) - set(TWINS)
    found = []
    for path in sorted((REPO / "framework" / "plan").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found, found


def test_parallel_auto_tries_every_registered_strategy_unless_told():
    """parallel.strategies left null is the registry's list: a strategy registered from its own file is
    weighed with no config edit."""
    cfg = _config("parallel=auto")
    assert cfg.parallel.strategies is None
    tried = {c.strategy for c, _ in rank_layouts(cfg, 4, device_named("h100"), 4)}
    assert set(TWINS) <= tried and {"ddp", "fsdp"} <= tried


def test_the_schema_and_the_launcher_write_out_no_strategy_name():
    """Lists of strategies come from the registry (a list written out elsewhere misses the next one)."""
    names = set(registry.STRATEGIES) - set(TWINS)
    found = [f"{path}:{node.lineno} {node.value!r}" for path in ("framework/config/schema.py", "framework/launch/admission.py")
             for node in ast.walk(ast.parse((REPO / path).read_text()))
             if isinstance(node, ast.Constant) and node.value in names]
    assert not found, found


@pytest.mark.parametrize("overrides", [
    ["planner.device=cpu"], ["planner.device=cpu", "launcher.nproc_per_node=4"], ["planner.device=h100"],
    ["planner.device=h100", "launcher.nproc_per_node=4"], ["planner.device=h100", "planner.gpus_per_node=2"],
    ["planner.device=h100", "planner.nodes=2", "launcher.nproc_per_node=4"],
], ids=lambda o: " ".join(o))
def test_parallel_auto_and_the_memory_check_plan_the_same_gpus_per_node(monkeypatch, overrides):
    """One rule for GPUs per node: what parallel=auto plans its pick with (launch) is what the memory check
    before launch plans the job with (plan/check)."""
    from framework.launch import admission
    import framework.plan.auto as auto
    import framework.plan.check as check
    from framework.runtime.world import world_size_for
    seen = {}

    class Planned(Exception):
        pass

    def record(key):
        def planned(cfg, world, device, per_node, *args, **kwargs):
            seen[key] = per_node
            raise Planned
        return planned
    monkeypatch.setattr(auto, "choose_layout", record("auto"))
    monkeypatch.setattr(check, "make_plan", record("check"))
    with pytest.raises(Planned):
        admission.choose_auto_layout(_config("parallel=auto", *overrides))
    cfg = _config("parallel=ddp", *overrides)
    with pytest.raises(Planned):
        check.refuse_if_it_cannot_fit(cfg, world_size_for(cfg, strategy_class("ddp")), lambda c: None)
    assert seen["auto"] == seen["check"], seen
