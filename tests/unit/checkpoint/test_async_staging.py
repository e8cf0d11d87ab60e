"""Background saves through the reused stager: its GPU configuration (pinned buffers, non-blocking
copies) survives the torch versions whose stagers close themselves (2.11's DefaultStager after each
stage, some async_save after each upload), and a save holds the step it was started at while the
next optimizer step changes the weights."""
import pytest
import torch
import torch.cuda._pin_memory_utils as pin_memory_utils
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager
from torch import nn

from framework.checkpoint import dcp_state
from framework.checkpoint.staging import ReusedStager
from framework.parallel.precision import Precision


class _Schedule:
    def state_dict(self):
        return {}


def _model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def _train_step(model, optimizer):
    model(torch.randn(4, 16)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _saved_weight(path):
    state = {"model": {"weight": torch.zeros(16, 16), "bias": torch.zeros(16)}}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state["model"]["weight"]


@pytest.fixture
def gpu_stager(monkeypatch):
    """The stager as a CUDA job builds it (pinned buffers, non-blocking copies), fed CPU tensors."""
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(pin_memory_utils, "pin_memory", lambda *a: None)
    monkeypatch.setattr(pin_memory_utils, "unpin_memory", lambda *a: None)
    with monkeypatch.context() as during_construction:     # the writer must still see no CUDA
        during_construction.setattr(torch.cuda, "is_available", lambda: True)
        during_construction.setattr(torch.accelerator, "is_available", lambda: True)
        stager = ReusedStager(torch.device("cuda"))
    assert stager._stager.pin_memory                         # the CUDA branch is the one driven
    yield stager
    stager.release()


def _periodic_saves_each_hold_their_step(tmp_path, stager):
    model, optimizer = _model_and_optimizer()
    for step in (4, 8, 12):
        _train_step(model, optimizer)
        expected = model.weight.detach().clone()
        dcp_state.save(str(tmp_path / f"step{step}"), model, optimizer, _Schedule(), Precision(None, None),
                       background=True, stager=stager).result()
        assert torch.equal(_saved_weight(tmp_path / f"step{step}"), expected)


def test_periodic_saves_survive_an_async_save_that_closes_the_stager(tmp_path, monkeypatch, gpu_stager):
    real_async_save = dcp.async_save

    def async_save_that_closes(*args, async_stager=None, **kwargs):
        future = real_async_save(*args, async_stager=async_stager, **kwargs)
        future.add_done_callback(lambda _: async_stager.close())
        return future

    monkeypatch.setattr(dcp, "async_save", async_save_that_closes)
    _periodic_saves_each_hold_their_step(tmp_path, gpu_stager)


def test_periodic_saves_survive_torch_2_11s_stager_that_closes_itself(tmp_path, monkeypatch, gpu_stager):
    # torch 2.11 (the GPU machine's): DefaultStager.stage closes its StateDictStager after each stage,
    # which empties the copier table; a stager built on DefaultStager failed its second save on the
    # H100 with KeyError: <class 'type'>.
    real_stage = DefaultStager.stage

    def stage_then_close(self, state_dict, **kwargs):
        staged = real_stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(DefaultStager, "stage", stage_then_close)
    _periodic_saves_each_hold_their_step(tmp_path, gpu_stager)


def test_a_background_save_holds_its_step_while_the_next_step_runs(tmp_path):
    model, optimizer = _model_and_optimizer()
    stager = ReusedStager(torch.device("cpu"))
    try:
        for step in (1, 2):                                  # the second save reuses the first's buffers
            _train_step(model, optimizer)
            at_save = model.weight.detach().clone()
            future = dcp_state.save(str(tmp_path / f"step{step}"), model, optimizer, _Schedule(),
                                    Precision(None, None), background=True, stager=stager)
            _train_step(model, optimizer)                    # step k+1 updates the weights in place
            assert not torch.equal(model.weight, at_save)
            future.result()
            assert torch.equal(_saved_weight(tmp_path / f"step{step}"), at_save)
    finally:
        stager.release()
