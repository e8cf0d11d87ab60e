"""Gradient clipping on DTensor shards (framework/parallel/grad_norm.py): the norm of the whole gradients,
taken on the local shards. Across ranks it is held by every layout's parity (the grad norm of each step
against the single-process run); here, in one process, what it computes and that it leaves DTensor's
dispatch alone where the shards suffice."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from framework.parallel.grad_norm import clip_grad_norm_, sharded_dims

LAYOUTS = [(Shard(0), Shard(1)), (Replicate(), Shard(0)), (Shard(1), Replicate()), (Replicate(), Replicate())]


@pytest.fixture
def mesh():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


def _params(mesh, layouts, plain: int = 1):
    """Parameters of each layout (and `plain` plain ones), with gradients; the gradients as full tensors."""
    gen = torch.Generator().manual_seed(0)
    params, full = [], []
    for i, placements in enumerate(layouts):
        for shape in ((6, 4), (3, 5)) + (() if Shard(1) in placements else ((5,),)):
            grad = torch.randn(shape, generator=gen) * (i + 1)
            p = torch.nn.Parameter(distribute_tensor(torch.zeros(shape), mesh, placements))
            p.grad = distribute_tensor(grad.clone(), mesh, placements)
            params.append(p)
            full.append(grad)
    for _ in range(plain):
        grad = torch.randn(7, generator=gen)
        params.append(torch.nn.Parameter(torch.zeros(7)))
        params[-1].grad = grad.clone()
        full.append(grad)
    return params, full


def _full(g):
    return g.full_tensor() if hasattr(g, "full_tensor") else g


@pytest.mark.parametrize("max_norm", [0.0, 1.0, 1e6])
def test_the_norm_and_the_clipping_are_torchs_on_the_full_gradients(mesh, max_norm):
    params, full = _params(mesh, LAYOUTS)
    expected = torch.nn.utils.get_total_norm(full)
    norm = clip_grad_norm_(params, max_norm, torch.device("cpu"))
    torch.testing.assert_close(norm, expected)
    ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in full]
    for r, g in zip(ref, full):
        r.grad = g.clone()
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(ref, max_norm)
    for p, r in zip(params, ref):
        torch.testing.assert_close(_full(p.grad), r.grad)


def test_counted_leaves_a_tied_copy_out_of_the_norm_but_scales_it(mesh):
    params, full = _params(mesh, LAYOUTS[:1], plain=0)
    norm = clip_grad_norm_(params, 1.0, torch.device("cpu"), counted=params[:1])
    torch.testing.assert_close(norm, full[0].norm())
    scale = 1.0 / (full[0].norm() + 1e-6)
    torch.testing.assert_close(_full(params[1].grad), full[1] * scale)


class _DTensorOps(TorchDispatchMode):
    """The ops dispatched with a DTensor among their arguments."""
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(isinstance(a, DTensor) for a in pytree.tree_leaves((args, kwargs or {}))):
            self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_sharded_and_replicated_gradients_are_measured_without_dtensor_dispatch(mesh):
    """A foreach op's first sharding propagation on a 2-D mesh costs ~10 ms a tensor in every new process
    (most of a short job's clipping); the shards hold all the norm and the scaling need."""
    params, _ = _params(mesh, LAYOUTS)
    with _DTensorOps() as seen:
        clip_grad_norm_(params, 1.0, torch.device("cpu"))
    assert seen.ops == []


def test_a_pending_partial_gradient_is_reduced_before_its_norm(mesh):
    """The norm of a sum is not the sum of the shards' norms: a Partial gradient goes through DTensor."""
    params, full = _params(mesh, [(Partial(), Replicate())], plain=0)
    norm = clip_grad_norm_(params, 0.0, torch.device("cpu"))
    torch.testing.assert_close(norm, torch.nn.utils.get_total_norm(full))


def test_every_dim_a_gradient_is_split_over_is_summed_fsdp_over_tp_included():
    """FSDP2 on a tp-sharded parameter shards dim 0 again with _StridedShard, which is not `is_shard()`:
    left out, the norm of such a layout missed the other dp ranks' pieces (a matrix job's grad norm was
    0.71 of its reference's)."""
    from torch.distributed.tensor.placement_types import _StridedShard
    assert sharded_dims((_StridedShard(0, split_factor=2), Shard(0))) == [0, 1]
    assert sharded_dims((Replicate(), Shard(1))) == [1]
    assert sharded_dims((Shard(0), Replicate())) == [0]


def test_bf16_gradients_are_measured_in_fp32():
    """precision.store_dtype=bfloat16: the norm of bf16 gradients is the fp32 norm of their values, not torch's
    total norm, which rounds each tensor's norm and the total to bf16."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)) for shape in ((33, 17), (5,), (64,))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16) * 3
    want = torch.linalg.vector_norm(torch.cat([p.grad.float().flatten() for p in params]))
    got = clip_grad_norm_(params, 0.0, torch.device("cpu"))
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    rounded = torch.nn.utils.get_total_norm([p.grad for p in params]).float()
    assert not torch.allclose(rounded, want, rtol=1e-6, atol=0)       # what the fp32 measure is for
