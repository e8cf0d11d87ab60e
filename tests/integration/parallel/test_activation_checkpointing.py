"""Activation checkpointing: less saved activation memory, the same loss and gradients, same names."""
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from framework.config.schema import ActivationCheckpointingConfig
from framework.models.llama import Llama, init_weights
from framework.parallel.activation_checkpointing import apply_activation_checkpointing
from tests.harness.helpers import max_rel_diff, train

ARGS = dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=64)


def ac_cfg(mode, **kw):
    return OmegaConf.structured(ActivationCheckpointingConfig(mode=mode, **kw))


def build(mode, **kw):
    torch.manual_seed(0)
    model = Llama(**ARGS)
    init_weights(model, seed=0)
    names = apply_activation_checkpointing(model, ac_cfg(mode, **kw))
    return model, names


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
        return func(*args, **(kwargs or {}))


def step(model):
    """Loss, gradients, bytes autograd saved for backward, and matmuls run during backward."""
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(model(tokens)[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    with CountMatmuls() as mm:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, sum(saved), mm.count


def test_checkpointing_saves_less_and_changes_nothing_else():
    runs = {mode: step(build(mode)[0]) for mode in ("none", "full")}
    runs["selective"] = step(build("layer", every_n_layers=2)[0])
    (loss, grads, saved_none, _), (_, _, saved_full, _) = runs["none"], runs["full"]
    saved_selective = runs["selective"][2]
    assert saved_full < saved_selective < saved_none
    # Half the blocks checkpointed: about half of the blocks' saved activations are gone.
    assert saved_none - saved_selective == pytest.approx((saved_none - saved_full) / 2, rel=0.05)
    for mode in ("full", "selective"):
        assert torch.equal(runs[mode][0], loss), mode
        for name, g in grads.items():
            assert torch.equal(runs[mode][1][name], g), (mode, name)


def test_selective_every_nth_block_and_save_matmuls_recomputes_no_matmul():
    _, names = build("layer", every_n_layers=2)
    assert names == ["layers.1", "layers.3"]
    assert build("full")[1] == [f"layers.{i}" for i in range(ARGS["n_layers"])]
    _, _, _, mm_plain = step(build("none")[0])
    _, _, _, mm_recompute = step(build("full")[0])
    _, _, _, mm_saved = step(build("layer", every_n_layers=1, save_matmuls=True)[0])
    assert mm_recompute > mm_plain          # full recomputes every block's matmuls in backward
    assert mm_saved == mm_plain             # matmul outputs saved: backward runs no forward matmul again


def kept_bytes(model) -> int:
    """Bytes of the tensors the forward made that are still alive when it returns: what autograd saved, and
    what a selective-checkpoint policy cached (which saved-tensor hooks never see)."""
    import weakref

    made = {}

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    made[id(storage)] = (weakref.ref(storage), storage.nbytes())
            return out

    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with Made():
        loss = model(tokens).sum()
    kept = sum(n for ref, n in made.values() if ref() is not None)
    del loss
    return kept


def test_op_level_keeps_matmuls_and_attention_and_changes_nothing_else():
    loss, grads, _, mm_plain = step(build("none")[0])
    model, names = build("op")
    op_loss, op_grads, _, mm_op = step(model)
    assert names == [f"layers.{i}" for i in range(ARGS["n_layers"])]
    kept = {mode: kept_bytes(build(mode)[0]) for mode in ("none", "full", "op")}
    assert kept["full"] < kept["op"] < kept["none"], kept
    assert mm_op == mm_plain                # no matmul runs twice
    assert torch.equal(op_loss, loss)
    for name, g in grads.items():
        assert torch.equal(op_grads[name], g), name


def test_op_level_keeping_every_other_matmul_recomputes_half_of_them_and_changes_nothing_else():
    loss, grads, _, mm_plain = step(build("none")[0])
    alternate, _ = build("op", save_every_nth_matmul=2)
    alt_loss, alt_grads, _, mm_alt = step(alternate)
    kept = {name: kept_bytes(model) for name, model in
            (("full", build("full")[0]), ("alternate", build("op", save_every_nth_matmul=2)[0]), ("op", build("op")[0]))}
    assert kept["full"] < kept["alternate"] < kept["op"], kept
    # Llama's block runs 7 forward matmuls (q, k, v, o, gate, up, down): the 2nd, 4th and 6th run again
    assert mm_alt - mm_plain == 3 * ARGS["n_layers"]
    assert torch.equal(alt_loss, loss)
    for name, g in grads.items():
        assert torch.equal(alt_grads[name], g), name


def test_op_level_keeps_attention_outputs():
    """Attention is not a matmul to the dispatcher: without it in the policy its kernel would run again."""
    class CountAttention(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountAttention.count += "scaled_dot_product" in func.__name__ and "backward" not in func.__name__
            return func(*args, **(kwargs or {}))

    model, _ = build("op")
    tokens = torch.randint(0, 256, (2, 32))
    with CountAttention():
        model(tokens).sum().backward()
    assert CountAttention.count == ARGS["n_layers"]      # once a block, in forward only


def test_parameter_and_state_dict_names_unchanged():
    plain, _ = build("none")
    checkpointed, _ = build("full")
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    checkpointed.load_state_dict(plain.state_dict())


def test_ddp_with_full_checkpointing_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "ddp_ac", ["parallel=ddp", "activation_checkpointing=full"])
    assert max_rel_diff(single_reference(), got) <= 1e-5


def test_fsdp_with_op_level_checkpointing_matches_single(tmp_path, single_reference):
    got = train(tmp_path, "fsdp_op", ["parallel=fsdp", "zero=stage3", "activation_checkpointing=selective",
                                      "activation_checkpointing.mode=op"])
    # bit-exact against AC none in one process (above); here FSDP's gradient reduce-scatter adds rounding
    assert max_rel_diff(single_reference(), got) <= 1e-6


def test_selective_mode_names_its_successors(compose_config):
    from tests.harness.helpers import derive_and_validate
    from framework.errors import ConfigError
    from framework.strategies.registry import strategy_class
    cfg = compose_config(["activation_checkpointing=selective", "activation_checkpointing.mode=selective"])
    with pytest.raises(ConfigError, match="'selective' is now 'layer'.*or 'op'"):
        derive_and_validate(cfg, 1, strategy_class(cfg.parallel.name))


def test_planner_measures_op_level_between_full_and_none(compose_config):
    """The planner runs the model with the configured checkpointing and counts what stays alive, so the
    op policy's kept matmul and attention outputs (which saved-tensor hooks never see) are in its bytes."""
    from framework.plan.activations import measure

    def block_bytes(*args):
        cfg = compose_config(["model=tiny", "data.seq_len=64", *args])
        return sum(sum(b.values()) for b in measure(cfg, 2, 64).blocks)

    none, full = block_bytes(), block_bytes("activation_checkpointing=full")
    op = block_bytes("activation_checkpointing=selective", "activation_checkpointing.mode=op")
    assert full < op < none
    kept = {mode: kept_bytes(build(mode)[0]) for mode in ("none", "op")}
    # the same share of a block's activations kept, in the planner's count and in the live-tensor count
    assert (op - full) / (none - full) == pytest.approx(
        (kept["op"] - kept_bytes(build("full")[0])) / (kept["none"] - kept_bytes(build("full")[0])), abs=0.1)
