"""Muon's step on sharded parameters is single's, bit for bit: two gloo ranks given the same batches (so the
averaged gradient is each rank's own, exactly) step an FSDP2-sharded model with optimizer=muon (gather and
round_robin) and DTensor matrices of uneven rows sharded by rows and by columns; each must equal torch.optim.Muon +
torch.optim.AdamW stepping the whole tensors in one process. (The jobs of test_muon_layouts.py compare whole runs,
whose gradients differ in summation order, to a tolerance.)"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from framework.optim.muon import MuonWithAdamW
from tests.unit.optim.test_muon import TINY, reference_optimizers, train

WORLD = 2


def _compose(overrides):
    from tests.harness.parity import _compose as compose
    return compose(overrides)


def _full(model):
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in
            model.named_parameters()}


def _sharded_model_run(mode):
    from torch.distributed.fsdp import fully_shard

    from framework.models.factory import ModelFactory
    from framework.optim.factory import OptimizerFactory
    cfg = _compose([*TINY, "optimizer=muon", f"optimizer.mode={mode}"])
    factory = ModelFactory(cfg)
    model = factory()
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (WORLD,))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = train(model, [OptimizerFactory(cfg.optimizer, factory.spec.output_heads())(model)], steps=3)
    return losses, _full(model)


def _matrices_run(mode, dim):
    torch.manual_seed(5)
    shapes = [(33, 20), (17, 9), (8, 64)]
    whole = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (WORLD,))
    params = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(dim)])) for w in whole]
    opt = MuonWithAdamW([{"params": params, "algorithm": "muon"}], lr=0.05, mode=mode)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = distribute_tensor(g, mesh, [Shard(dim)])
        opt.step()
    return whole, grads, [p.full_tensor() for p in params]


def _worker(rank, store_path, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD)
    try:
        results = {mode: _sharded_model_run(mode) for mode in ("gather", "round_robin")}
        matrices = {(mode, dim): _matrices_run(mode, dim) for mode in ("gather", "round_robin") for dim in (0, 1)}
        if rank == 0:
            torch.save({"model": results, "matrices": matrices}, out)
    finally:
        dist.destroy_process_group()


def test_sharded_muon_equals_torch_on_whole_tensors(tmp_path):
    out = tmp_path / "results.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD)
    got = torch.load(out)
    torch.set_num_threads(1)
    cfg = _compose([*TINY, "optimizer=muon"])
    from framework.models.factory import ModelFactory
    model = ModelFactory(cfg)()
    ref_losses = train(model, reference_optimizers(model, cfg.optimizer), steps=3)
    for mode, (losses, params) in got["model"].items():
        assert losses == ref_losses, mode
        for name, p in model.named_parameters():
            assert torch.equal(params[name], p), (mode, name)
    for (mode, dim), (whole, grads, stepped) in got["matrices"].items():
        params = [torch.nn.Parameter(w.clone()) for w in whole]
        ref = torch.optim.Muon(params, lr=0.05)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g
            ref.step()
        for p, q in zip(stepped, params):
            assert torch.equal(p, q), (mode, dim, tuple(p.shape))
