"""The worker-side interface every strategy implements: everything the trainer needs that depends on how the job
is parallelised. The trainer calls only these methods; what a strategy must define is abstract. Its class-level
declarations (capabilities, validation, the planner's traits) are its traits class (traits.py), which its runtime
class subclasses."""
from __future__ import annotations

import abc
import contextlib
import gc
import os
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import nn

from framework.metrics.memory import local_bytes
from framework.parallel.batch_layout import BatchLayout
from framework.parallel.process_group import init_default_group
from framework.runtime.devices import join_one_process_world, prepare_worker, process_group_backend
from framework.strategies.traits import StrategyTraits

if TYPE_CHECKING:
    from framework.config.schema import Config
    from framework.models.factory import ModelFactory


class Strategy(StrategyTraits, abc.ABC):
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self.rank = int(os.environ.get("RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.device = self._pick_device()
        self._grad_bytes = 0
        self._host_group = None

    def _pick_device(self) -> torch.device:
        want = self.cfg.device
        if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def setup_distributed(self) -> None:
        prepare_worker(self.cfg, self.device)
        if self.needs_process_group:
            join_one_process_world()
        if "WORLD_SIZE" in os.environ and not dist.is_initialized():
            init_default_group(process_group_backend(self.cfg, self.device), self.device, self.cfg.launcher.timeout_s)

    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def is_main(self) -> bool:
        """The one rank that logs and writes shared files."""
        return self.rank == 0

    @abc.abstractmethod
    def setup(self, build_model: "ModelFactory",
              build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
              build_scheduler: Callable[[torch.optim.Optimizer], object]) -> None:
        """Build the model (build_model()), its optimizer (build_optimizer(model): the model, whose names choose
        the optimizer's groups) and LR schedule, wrapped as this strategy runs them."""

    @abc.abstractmethod
    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        """Run all micro-batches of this rank's share of one global batch, accumulate the gradient
        of the global-batch mean loss, and return that mean loss (a 0-d tensor, same on every rank).
        Nothing here may wait for the device: the trainer reads the loss only on the steps it logs.
        `loss_fn` is the job's objective (framework.objectives): loss_fn(output, targets)."""

    @abc.abstractmethod
    def optimizer_step(self, max_grad_norm: float) -> torch.Tensor:
        """Clip (0 = measure only), step optimizer and LR schedule, zero gradients; return the grad norm
        as a 0-d tensor (read only on logged steps)."""

    def plan_batches(self, layout: BatchLayout) -> None:
        """Before a step whose batch layout differs from the previous step's (a step of a batch-size ramp,
        micro-batches halved after an out-of-memory error). Here nothing: forward_backward takes whatever
        micro-batches it is handed."""

    def drop_step(self) -> None:
        """Forget a step that failed part-way (out of memory): its gradients, and the memory the CUDA
        allocator keeps cached, so that the step can run again with smaller micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def first_report(self, report: str | None) -> str | None:
        """The report of the lowest rank that has one (None: no rank has); every rank calls it. Agreed among
        the hosts over gloo, so that no rank waits for its device: one flag, and the reports only where one is."""
        if not dist.is_initialized():
            return report
        if self._host_group is None:
            self._host_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        vote = torch.tensor([int(report is not None)])
        dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self._host_group)
        if not vote.item():
            return None
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report, group=self._host_group)
        return next(r for r in reports if r is not None)

    #: the frozen reference model build_reference made (None: none)
    reference_model: nn.Module | None = None

    def build_reference(self, build_model: "ModelFactory") -> None:
        """A frozen copy of the initial model (never the checkpoint's: a resumed run's reference is the one it
        started from), laid out as the policy is and never stepped or saved: what `reference()` runs. Strategies
        that can (traits' frozen_reference) override it."""
        raise NotImplementedError(f"parallel={self.name} builds no frozen reference model")

    @contextlib.contextmanager
    def reference(self):
        """Within: eval_loss runs the reference model build_reference made (without one: the policy as it is)."""
        if self.reference_model is None:
            yield
            return
        policy, self.model = self.model, self.reference_model
        try:
            yield
        finally:
            self.model = policy

    @abc.abstractmethod
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        """The mean of loss_fn over the micro-batches without gradient (evaluation, samples' picks, MoE's batch
        statistics), the same on every rank."""

    def gather_batch_statistics(self, micro_batches, loss_fn) -> None:
        """Where the model's training loss reads statistics of the whole global batch (the spec's
        batch_statistics: MoE's balance loss), a forward of each micro-batch without gradient gathers them
        first; a step that is one forward in the world is its own global batch. Every rank calls this at
        the start of forward_backward."""
        from framework.models.spec import spec_for
        if not hasattr(self, "_batch_statistics"):
            self._batch_statistics = spec_for(self.cfg.model).batch_statistics(self.cfg.model)
        if self._batch_statistics is None or (self.world_size == 1 and len(micro_batches) <= 1):
            return
        with self._batch_statistics.gathering(self.device):
            self.eval_loss(micro_batches, loss_fn)

    @property
    def needs_batches(self) -> bool:
        """False on ranks that take no token batches (inner pipeline stages)."""
        return True

    # ---- checkpoints (all ranks call these; `path` is one step's directory) ---------------
    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Model, optimizer, LR schedule and precision state of this strategy."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """What save_checkpoint wrote, into this strategy's model, optimizer, LR schedule and precision."""


    def save_checkpoint_async(self, path: str):
        """Start saving; return a Future whose result() means the state is on disk."""
        raise NotImplementedError(f"parallel={self.name} cannot save in the background")

    def discard_gradients(self) -> None:
        """Skip this step's update (trainer.on_nonfinite=skip, which validation allows only where a strategy
        defines this); the LR schedule still advances."""
        raise NotImplementedError(f"parallel={self.name} cannot skip a step")

    def step_metrics(self) -> dict:
        """Extra numbers for the metrics record of the last step (e.g. loss scale, skipped steps)."""
        return {}

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])     # torchao's optimizers keep it as a tensor

    def unwrapped_model(self) -> nn.Module:
        return self.model

    def memory_breakdown(self) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer states that this rank actually holds."""
        params = list(self.model.parameters())
        state = [t for s in self.optimizer_states() for t in s.values() if isinstance(t, torch.Tensor)]
        out = {
            "param_bytes": sum(local_bytes(p) for p in params),
            "grad_bytes": self._grad_bytes,
            "optim_state_bytes": sum(local_bytes(t) for t in state),
        }
        if self.reference_model is not None:
            out["reference_bytes"] = sum(local_bytes(p) for p in self.reference_model.parameters())
        return out

    def optimizer_states(self):
        return self.optimizer.state.values()

    def reduce_mean(self, value: torch.Tensor, group=None) -> torch.Tensor:
        if not dist.is_initialized():
            return value
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
        return value / dist.get_world_size(group)

    def all_gather(self, value: torch.Tensor) -> torch.Tensor:
        """Every rank's `value` (the same shape on each), concatenated along dim 0 in rank order."""
        if not dist.is_initialized():
            return value
        parts = [torch.empty_like(value, device=self.device) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, value.to(self.device))
        return torch.cat(parts).to(value.device)

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def teardown(self) -> None:
        # Wrappers such as DDP's Reducer hold the process group. Freed after it is destroyed, they
        # would run the gloo destructor, which joins its threads while holding the GIL: a deadlock.
        if dist.is_initialized():
            dist.barrier()
        self.model = self.optimizer = self.scheduler = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
