"""memory_gb covers one log interval (peak allocated and reserved, reset after each log), and
background saves stage into one set of reused CPU buffers instead of a fresh copy per save."""
import os

import pytest
import torch
from torch import nn

from framework.checkpoint import dcp_state
from framework.checkpoint.staging import ReusedStager
from framework.metrics.memory import IntervalPeakMemory
from framework.parallel.precision import Precision


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux resets the peak RSS only")
def test_cpu_peak_is_per_interval():
    memory = IntervalPeakMemory(torch.device("cpu"))
    memory.reset()
    before = memory.read()["memory_gb"]
    big = torch.ones(256 * 2**20 // 4)     # 256 MiB, touched
    during = memory.read()
    del big
    memory.reset()
    after = memory.read()["memory_gb"]
    assert during["memory_gb"] >= before + 0.2 and during["memory_reserved_gb"] == during["memory_gb"]
    assert after < during["memory_gb"] - 0.2          # a lifetime peak would still include the 256 MiB


def test_cuda_reports_allocated_and_reserved_and_resets_on_its_device(monkeypatch):
    device = torch.device("cuda", 1)
    calls = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: calls.append(("allocated", d)) or 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: calls.append(("reserved", d)) or 5 * 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    memory = IntervalPeakMemory(device)
    assert memory.read() == {"memory_gb": 3.0, "memory_reserved_gb": 5.0}
    memory.reset()
    assert calls == [("allocated", device), ("reserved", device), ("reset", device)]


class _Schedule:
    def state_dict(self):
        return {}


def test_background_saves_reuse_one_set_of_staging_buffers(tmp_path):
    model = nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    stager = ReusedStager(torch.device("cpu"))
    try:
        saved, buffers = [], []
        for step in (1, 2):
            with torch.no_grad():
                model.weight.fill_(step)
            dcp_state.save(str(tmp_path / f"s{step}"), model, optimizer, _Schedule(), Precision(None, None),
                           background=True, stager=stager).result()
            buffers.append({id(b) for b in stager._stager._cached_storage_mapping.values()})
            saved.append(step)
        assert buffers[0] and buffers[1] == buffers[0]       # the second save allocated nothing new
        for step in saved:                                   # and each save holds its own step's values
            state = {"model": {"weight": torch.zeros(64, 64), "bias": torch.zeros(64)}}
            torch.distributed.checkpoint.load(state, checkpoint_id=str(tmp_path / f"s{step}"), no_dist=True)
            assert torch.equal(state["model"]["weight"], torch.full((64, 64), float(step)))
    finally:
        stager.release()
