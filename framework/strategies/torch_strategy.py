"""TorchStrategy: the shared loop body of strategies whose model is a torch nn.Module driven by a torch optimizer
(single, ddp, fsdp, 3d)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from framework.metrics.memory import local_bytes
from framework.models.loss import weighted_micro_batch
from framework.parallel.build_order import checkpoint_compile_wrap
from framework.parallel.float8 import convert_float8
from framework.parallel.precision import STORE_DTYPES, build_precision
from framework.strategies.runtime import Strategy
from framework.strategies.traits import StrategyTraits

if TYPE_CHECKING:
    from framework.config.schema import Config


def frozen(model: nn.Module) -> nn.Module:
    """A model that is only read: no gradients, evaluation mode."""
    return model.requires_grad_(False).eval()


class TorchTraits(StrategyTraits):
    """What every strategy whose loop is TorchStrategy declares: torch.distributed.checkpoint's saves."""
    precision_autocast = True
    store_dtypes = STORE_DTYPES
    checkpoint_format = "dcp"
    supports_async_save = True
    saves_to_urls = True
    worker_modules = ("framework.checkpoint.dcp_state", "framework.parallel.grad_norm")
    frozen_reference = True


class TorchStrategy(TorchTraits, Strategy):
    """Shared loop body for strategies whose model is a torch nn.Module driven by a torch optimizer."""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.precision = build_precision(cfg, self.device, autocast=self.precision_autocast)
        self._async_group = None
        self._stager = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self, model, build_optimizer):
        return build_optimizer(model)

    def accumulation_context(self, is_last: bool):
        """Skip gradient synchronisation on all but the last micro-batch where the wrapper allows it."""
        return contextlib.nullcontext()

    def autocast(self):
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def setup(self, model_factory, build_optimizer, build_scheduler) -> None:
        model = model_factory().to(self.device)
        convert_float8(model, self.cfg.precision, model_factory.spec, fsdp=False)
        self.model = checkpoint_compile_wrap(model, self.cfg, model_factory.spec, self.wrap_model)
        self.optimizer = self.make_optimizer(self.model, build_optimizer)
        self.scheduler = build_scheduler(self.optimizer)

    def build_reference(self, model_factory) -> None:
        """A replica of the initial model on every rank, no wrapper (it takes no gradient to synchronise)."""
        model = model_factory().to(self.device)
        convert_float8(model, self.cfg.precision, model_factory.spec, fsdp=False)
        self.reference_model = frozen(model)

    def step_metrics(self) -> dict:
        return self.precision.metrics()

    def discard_gradients(self) -> None:
        """Skip this step's update (a non-finite loss under trainer.on_nonfinite=skip); the LR schedule
        still advances so it stays aligned with the step count."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def checkpoint_optimizer(self):
        """The optimizer whose state is saved: the one holding this rank's states."""
        return self.optimizer

    def checkpoint_model(self) -> nn.Module:
        """The module whose parameter names are the full model's (wrappers are seen through by DCP)."""
        return self.model

    def save_checkpoint(self, path: str) -> None:
        from framework.checkpoint import dcp_state
        dcp_state.save(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler, self.precision)

    def save_checkpoint_async(self, path: str):
        # The background writer gets a process group of its own, so its collectives never
        # interleave with the training step's on the default group.
        from framework.checkpoint import dcp_state
        from framework.checkpoint.staging import ReusedStager
        if dist.is_initialized() and self._async_group is None:
            self._async_group = dist.new_group(backend="gloo")
        if self._stager is None:
            self._stager = ReusedStager(self.device)
        return dcp_state.save(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler,
                              self.precision, background=True, group=self._async_group, stager=self._stager)

    def teardown(self) -> None:
        if self._stager is not None:
            self._stager.release()
            self._stager = None
        super().teardown()

    def load_checkpoint(self, path: str) -> None:
        from framework.checkpoint import dcp_state
        dcp_state.load(path, self.checkpoint_model(), self.checkpoint_optimizer(), self.scheduler, self.precision)

    def _to_device(self, batch):
        return (t.to(self.device, non_blocking=True) for t in batch)

    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        self.gather_batch_statistics(micro_batches, loss_fn)
        return self.accumulate(micro_batches, loss_fn)

    def accumulate(self, micro_batches, loss_fn) -> torch.Tensor:
        """Forward and backward of each micro-batch in turn, the gradient accumulated."""
        self.model.train()
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            inputs, targets, *documents = self._to_device(batch)
            with self.accumulation_context(is_last=i == n - 1), weighted_micro_batch(1 / n):
                with self.autocast():
                    loss = loss_fn(self.model(inputs, *documents), targets)
                self.backward(loss / n)
            total += loss.detach().float()
        return self.reduce_mean(total / n)

    #: the process group over which pipeline stages sum their gradient norms (None: no pipeline)
    stage_group = None

    def clip_grad_norm(self, max_grad_norm: float) -> torch.Tensor:
        from framework.parallel.grad_norm import clip_grad_norm_     # DTensor: in the worker only
        return clip_grad_norm_(self.model.parameters(), max_grad_norm, self.device, self.stage_group)

    def optimizer_step(self, max_grad_norm: float) -> torch.Tensor:
        self.precision.unscale_(self.optimizer)
        grad_norm = self.clip_grad_norm(max_grad_norm)
        self._grad_bytes = sum(local_bytes(p.grad) for p in self.model.parameters() if p.grad is not None)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm

    @torch.no_grad()
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for batch in micro_batches:
            inputs, targets, *documents = self._to_device(batch)
            with self.autocast():
                total += loss_fn(self.model(inputs, *documents), targets).float()
        return self.reduce_mean(total / max(1, len(micro_batches)))
