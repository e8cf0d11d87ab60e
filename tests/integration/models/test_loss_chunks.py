"""The chunked loss (model.loss_chunk_tokens) equals the all-at-once loss and gradients, for every native
family (gpt2's head tied to its embedding; MoE, Llama's variant, through Llama's own top level), with
ignored targets counted out as F.cross_entropy does; its backward never holds all of the fp32 logits, and
it keeps as many fewer bytes for backward on MoE as on Llama."""
import pytest
import torch

from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.models.gpt2.model import GPT2
from framework.models.llama.model import Llama, init_weights
from framework.models.loss import IGNORE_INDEX, cross_entropy
from framework.models.moe.model import MoETransformer
from framework.runtime import world
from framework.strategies.registry import strategy_class
from tests.harness.helpers import max_rel_diff, train

FAMILIES = {
    "llama": lambda chunk: Llama(dim=32, n_layers=2, n_heads=4, vocab_size=97, max_seq_len=16,
                                 loss_chunk_tokens=chunk),
    "gpt2": lambda chunk: GPT2(dim=32, n_layers=2, n_heads=4, vocab_size=97, max_seq_len=16,
                               loss_chunk_tokens=chunk),
    "moe": lambda chunk: _moe(chunk),
}


def _moe(chunk: int) -> MoETransformer:
    """Seeded by name (its experts' weights have no init of their own); the loop over experts, since torch's
    grouped GEMM takes no float64."""
    model = MoETransformer(dim=32, n_layers=2, n_heads=4, vocab_size=97, max_seq_len=16, n_experts=4, moe_ffn_dim=16,
                           expert_compute="loop", loss_chunk_tokens=chunk)
    init_weights(model, seed=0)
    return model


def _loss_and_grads(family: str, chunk: int, dtype: torch.dtype, targets: torch.Tensor):
    torch.manual_seed(0)
    model = FAMILIES[family](chunk).to(dtype)
    tokens = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    loss = cross_entropy(model(tokens), targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_loss_equals_the_whole(family, dtype):
    targets = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(2))
    targets[0, :5] = IGNORE_INDEX          # padding: not counted in the mean
    whole, whole_grads = _loss_and_grads(family, 0, dtype, targets)
    chunked, chunked_grads = _loss_and_grads(family, 7, dtype, targets)   # 48 tokens: 6 chunks of 7 and one of 6
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    if family == "gpt2":
        assert "lm_head.weight" not in whole_grads    # tied: one parameter gets both contributions
    assert whole_grads.keys() == chunked_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-6, atol=1e-6, msg=name)


def test_eval_mode_returns_logits():
    model = FAMILIES["llama"](4).eval()
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 97)


def _largest_fp32_logits(chunk: int) -> int:
    """The most (token, vocab) fp32 elements any one op of the loss's forward or backward makes, watched
    at the dispatcher (the output weight's (dim, vocab) transpose is not logits: dim 32 is no token count)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    vocab, dim, largest = 97, 32, [0]

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 2
                        and t.shape[-1] == vocab and t.shape[-2] != dim):
                    largest[0] = max(largest[0], t.numel())
            return out

    torch.manual_seed(0)
    model = FAMILIES["llama"](chunk)
    tokens = torch.randint(0, vocab, (2, 12))
    with Watch():
        cross_entropy(model(tokens), tokens).backward()
    return largest[0]


def test_loss_holds_one_chunk_of_logits():
    assert _largest_fp32_logits(0) == 24 * 97
    assert _largest_fp32_logits(8) == 8 * 97


def _saved_bytes(family: str, chunk: int) -> int:
    """Bytes autograd keeps for backward over a training forward and its loss."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t
    torch.manual_seed(0)
    model = FAMILIES[family](chunk)
    tokens = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cross_entropy(model(tokens), tokens)
    return sum(saved)


def test_chunks_save_as_much_on_moe_as_on_llama():
    """One code path: chunking takes the same bytes off MoE's saved activations as off Llama's (the same head,
    vocabulary and tokens), where MoE's own copy of Llama's top level once returned the whole logits."""
    drop = {family: _saved_bytes(family, 0) - _saved_bytes(family, 8) for family in ("llama", "moe")}
    assert drop["llama"] > 0 and drop["moe"] == drop["llama"], drop


# 64 tokens a micro-batch (FAST: 2 x 32): chunks of 24, 24 and 16.
@pytest.mark.parametrize("layout", [["parallel=single"], ["parallel=fsdp", "zero=stage3"]], ids=["single", "fsdp"])
def test_chunked_loss_trains_as_the_whole(tmp_path, single_reference, layout):
    chunked = train(tmp_path, "chunked", [*layout, "model.loss_chunk_tokens=24"])
    assert max_rel_diff(chunked, single_reference()) < 1e-6


@pytest.mark.parametrize("args,expected", [
    (["model.loss_chunk_tokens=-1"], "model.loss_chunk_tokens: must be 0"),
    (["parallel=3d", "parallel.tp=2", "model.loss_chunk_tokens=64"],
     "model.loss_chunk_tokens: the chunked loss does not run under parallel.tp=2"),
])
def test_chunked_loss_refusals_name_the_key(compose_config, args, expected):
    cfg = compose_config(args)
    cls = strategy_class(cfg.parallel.name)
    with pytest.raises(ConfigError, match=expected):
        derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)


def test_planner_counts_one_chunk_of_logits(compose_config):
    """The planner measures what the loss keeps after its forward (framework/plan/activations.py runs it):
    with chunks, the tail no longer holds the micro-batch's fp32 logits (nor the log-softmax saved for them)."""
    from framework.plan.activations import measure
    micro, seq = 2, 64

    def tail_bytes(*args):
        cfg = compose_config(["model=tiny", f"data.seq_len={seq}", *args])
        return sum(measure(cfg, micro, seq).tail.values()), cfg

    whole, cfg = tail_bytes()
    chunked, _ = tail_bytes("model.loss_chunk_tokens=16")
    logits, one_chunk = micro * seq * cfg.model.vocab_size * 4, 16 * cfg.model.vocab_size * 4
    assert whole - chunked >= logits - one_chunk
