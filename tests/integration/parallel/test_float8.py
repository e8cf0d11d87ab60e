"""precision=float8 (torchao): refused where no float8 matmuls run, emulated on CPU for numerics; the converted
linears keep fp32 weights under their names, so checkpoints move between float8 and bf16 runs; an MoE router's
gate stays out; under FSDP2 (tensorwise) the weights' scales for the next step come from one all-reduce."""
import pytest
import torch
from omegaconf import OmegaConf

from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.models.llama import Llama
from framework.models.llama.spec import SPEC as LLAMA
from framework.models.spec import spec_for
from framework.parallel.float8 import convert_float8
from framework.runtime import world
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, check_ok, counted, counters_env, losses, max_rel_diff, run_framework

pytest.importorskip("torchao")
EMULATED = ["precision=float8", "precision.float8_emulate=true"]
#: emulated float8 against bf16 over FAST's 8 steps (measured: 2.2e-4 tensorwise, 1.1e-4 rowwise)
TOLERANCE = 1e-3


def _validate(compose_config, args):
    cfg = compose_config(args)
    cls = strategy_class(cfg.parallel.name)
    derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)


@pytest.mark.parametrize("args,expected", [
    (["precision=float8"], "precision: the cpu has no float8 matmuls"),
    ([*EMULATED, "precision.float8_recipe=blockwise"], "precision.float8_recipe: 'blockwise' is not one of tensorwise\\|rowwise"),
    ([*EMULATED, "parallel=3d", "parallel.tp=2"], "precision: float8 under parallel.tp=2 is not built"),
    ([*EMULATED, "parallel=deepspeed"], "parallel=deepspeed does not support precision=float8"),
])
def test_refusals_name_the_key(compose_config, args, expected):
    with pytest.raises(ConfigError, match=expected):
        _validate(compose_config, args)


def test_without_torchao_names_the_extra(compose_config, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"precision: precision=float8 needs torchao: pip install 'framework\[float8\]'"):
        _validate(compose_config, EMULATED)


def test_blocks_linears_convert_and_keep_fp32_weights_under_their_names(compose_config):
    cfg = compose_config([*EMULATED, "model.dim=64"])
    model = Llama(dim=64, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=64)
    names = {n: p.dtype for n, p in model.named_parameters()}
    converted = convert_float8(model, cfg.precision, LLAMA, fsdp=False)
    assert converted and all(name.startswith("layers.") for name in converted)
    assert {n: p.dtype for n, p in model.named_parameters()} == names       # every weight fp32, same names
    assert type(model.output) is torch.nn.Linear and type(model.tok_embeddings) is torch.nn.Embedding


def test_the_moe_routers_gate_stays_out(compose_config):
    """16 experts make the gate's dims divide by 16, as the float8 kernels need: it is still left alone."""
    cfg = compose_config([*EMULATED, "model=moe_tiny", "model.dim=64", "model.n_experts=16", "model.shared_ffn_dim=64"])
    spec = spec_for(cfg.model)
    with torch.device("meta"):
        model = spec.build(cfg.model)
    converted = convert_float8(model, cfg.precision, spec, fsdp=False)
    assert "layers.0.attention.wq" in converted and "layers.0.feed_forward.shared_expert.w1" in converted
    assert not [name for name in converted if "router" in name]
    assert type(model.layers["0"].feed_forward.router.gate) is torch.nn.Linear


def test_fsdp_computes_the_next_scales_in_one_all_reduce_and_matches_one_process(tmp_path):
    """FSDP2 all-gathers float8 weights (tensorwise); after each optimizer step one all-reduce of every weight's
    amax gives their scales (counted: each later step all-reduces fewer times than there are float8 weights,
    where the first, without precomputed scales, reduces each weight's amax at each all-gather), with the
    losses of the one-process float8 run (within float8's tolerance: FSDP2 casts the weights to bf16 before
    float8, one process autocasts)."""
    args = [*FAST, *EMULATED, "model.dim=64", "trainer.max_steps=4"]
    fsdp, single = tmp_path / "fsdp", tmp_path / "single"
    check_ok(run_framework([*args, "parallel=fsdp", "zero=stage3"], fsdp, env=counters_env(fsdp)))
    check_ok(run_framework([*args, "parallel=single"], single))
    assert max_rel_diff(losses(single), losses(fsdp)) < TOLERANCE
    model = Llama(dim=64, n_layers=2, n_heads=4, vocab_size=256, max_seq_len=64)
    weights = len(convert_float8(model, OmegaConf.create({"name": "float8", "float8_recipe": "tensorwise",
                                                          "float8_emulate": True}), LLAMA, fsdp=True))
    for rank, steps in counted(fsdp).items():
        reduces = [sum(n for key, n in step["calls"].items() if key.endswith("|all_reduce")) for step in steps]
        assert len(reduces) == 4 and reduces[0] > weights, (rank, reduces)
        assert all(n < weights for n in reduces[1:]) and len(set(reduces[1:])) == 1, (rank, reduces, weights)


def test_emulated_float8_trains_within_tolerance_of_bf16_and_its_checkpoint_moves_to_bf16(tmp_path):
    float8_dir, bf16_dir = tmp_path / "float8", tmp_path / "bf16"
    check_ok(run_framework([*FAST, *EMULATED, "checkpoint.enabled=true", "checkpoint.interval=4"], float8_dir))
    check_ok(run_framework([*FAST, "precision=bf16"], bf16_dir))
    assert max_rel_diff(losses(bf16_dir), losses(float8_dir)) < TOLERANCE
    # float8's step-4 checkpoint into a bf16 run, and that run's checkpoint back into float8
    step_4 = float8_dir / "checkpoints" / "step_00000004"
    resumed = tmp_path / "resumed_bf16"
    check_ok(run_framework([*FAST, "precision=bf16", "checkpoint.enabled=true", f"checkpoint.resume={step_4}",
                            "trainer.stop_at_step=6"], resumed))
    assert max_rel_diff(losses(bf16_dir)[4:6], losses(resumed)) < TOLERANCE
    back = tmp_path / "back_to_float8"
    check_ok(run_framework([*FAST, *EMULATED, f"checkpoint.resume={resumed / 'checkpoints' / 'step_00000006'}"], back))
    assert max_rel_diff(losses(float8_dir)[6:], losses(back)) < TOLERANCE


def test_planner_gathers_exactly_the_converted_weights_at_one_byte(compose_config):
    """The planner's float8 all-gather against the parameters convert_float8 actually converts."""
    from framework.models.factory import ModelFactory
    from framework.plan.comm import comm_bytes, fsdp_passes
    from framework.plan.layout import layout_of
    from framework.plan.shapes import rank_parameters

    def gathered(*args):
        cfg = compose_config(["parallel=fsdp", "zero=stage3", "model=small", *args])
        derive_and_validate(cfg, 2, strategy_class("fsdp"))
        layout = layout_of(cfg, 2)
        return comm_bytes(layout, rank_parameters(cfg, layout), 0, 0, 0)["dp_shard/all_gather"], cfg, layout

    bf16, _, _ = gathered("precision=bf16")
    float8, cfg, layout = gathered(*EMULATED)
    rowwise, _, _ = gathered(*EMULATED, "precision.float8_recipe=rowwise")
    model = ModelFactory(cfg).meta()
    converted = convert_float8(model, cfg.precision, spec_for(cfg.model), fsdp=True)
    converted_params = sum(model.get_submodule(name).weight.numel() for name in converted)
    gathers, _ = fsdp_passes(layout)                                    # each block unit's all-gathers a step
    assert rowwise == bf16                                              # rowwise gathers bf16
    assert gathers >= 1 and converted_params > 0
    assert bf16 - float8 == gathers * converted_params                  # 2 bytes -> 1 for each converted weight


def test_the_planners_operator_trace_has_float8s_scaling_and_casts_and_the_same_matmuls(compose_config):
    # the GPU step time is timed from this trace: a float8 block moves more bytes eagerly (amax, scale and
    # cast of each linear's input, weight and gradient) than a bf16 one; the head and loss are not converted
    from framework.plan import op_costs
    bf16 = compose_config(["model=small", "precision=bf16"])
    float8 = compose_config(["model=small", *EMULATED])
    seq = bf16.data.seq_len
    plain, converted = op_costs.traced(bf16, 1, seq), op_costs.traced(float8, 1, seq)
    assert converted.matmuls == plain.matmuls
    assert converted.memory_bytes["block"] > 1.5 * plain.memory_bytes["block"]
    assert converted.fused_bytes["block"] > plain.fused_bytes["block"]
    assert converted.memory_bytes["rest"] == plain.memory_bytes["rest"]
