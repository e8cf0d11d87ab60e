"""DeepSpeed: ZeRO stages 0-3 with CPU or NVMe offload, from a DeepSpeed config generated from the run.

The DeepSpeed JSON (config.py) is resolved once from the config groups, checked in the
launching process, and written to <run dir>/ds_config.json by rank 0. Without CUDA, DeepSpeed runs
on its CPU accelerator over gloo. deepspeed is imported only inside the workers (it is slow to import).
"""
from __future__ import annotations

import contextlib

import importlib.util
import math
import os
from typing import TYPE_CHECKING, Optional

import torch

from framework.errors import ConfigError
from framework.metrics.memory import local_bytes
from framework.models.loss import weighted_micro_batch
from framework.parallel.activation_checkpointing import MODES as AC_MODES
from framework.parallel.build_order import checkpoint_compile_wrap
from framework.parallel.precision import compute_dtype
from framework.runtime.devices import device_type
from framework.runtime.host_memory import returning_large_frees
from framework.runtime.world import OPEN_CPU_WORKERS
from framework.strategies.runtime import Strategy
from framework.strategies.traits import AutoLayout, StrategyTraits
from framework.strategies.deepspeed import config as dsc
from framework.strategies.deepspeed.adopt import adopt
from framework.strategies.deepspeed.ops import skip_inference_comm_op
from framework.strategies.deepspeed.options import DeepSpeedOptions
from framework.strategies.deepspeed.restricted_load import restricted_engine_load

if TYPE_CHECKING:
    from framework.config.schema import Config


def _use_cpu_accelerator() -> None:
    """DeepSpeed reads its accelerator from the environment once, when first imported."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


class DeepSpeedTraits(StrategyTraits):
    """What parallel=deepspeed declares for the launcher, validation and the planner."""
    name = "deepspeed"
    checkpoint_format = "deepspeed"
    # Its own CUDA kernels (fused optimizers, ZeRO's bucketed reductions on side streams) are outside
    # torch.use_deterministic_algorithms, which can neither fix nor refuse them, and DeepSpeed documents
    # no deterministic mode.
    deterministic_refusal = ("runs DeepSpeed's own kernels, which torch's deterministic switch does not cover; "
                             "use parallel=fsdp (zero=stage1-3 shard the same way) or trainer.deterministic=false")
    options = DeepSpeedOptions
    flat_optimizer_partitions = True
    default_workers = OPEN_CPU_WORKERS
    zero_support = {0: None, 1: None, 2: None, 3: None}
    precisions = ("fp32", "bf16", "fp16")
    store_dtype_note = ("its bf16 engine steps an fp32 master copy of every parameter itself; "
                        "parallel=fsdp (zero=stage2-3) or parallel=ddp train bf16 parameters")
    activation_checkpointing = AC_MODES
    compile_note = ("DeepSpeed's engine compiles through its own engine.compile(), which the framework does not "
                    "drive yet; parallel=fsdp zero=stage3 compiles per block")
    batch_change_note = ("its engine fixes train_micro_batch_size_per_gpu and gradient_accumulation_steps when it "
                         "starts; parallel=fsdp shards alike and can")
    # what the planner reads: ZeRO's flat partitions; stage1 reduces the gradients into the rank's
    # partition as stage2 does, every micro-batch
    dp_sharding = "flat"
    zero_shards = {1: frozenset({"optimizer", "grads"})}
    reduces_every_micro_batch = True
    machinery = 4
    frozen_reference = True

    @classmethod
    def flat_sizes(cls, cfg: Config) -> dict[str, int]:
        p = cfg.parallel
        return {"reduce_bucket": p.reduce_bucket_size, "prefetch_bucket": p.stage3_prefetch_bucket_size,
                "persistence_threshold": p.stage3_param_persistence_threshold}

    @classmethod
    def casts_weights(cls, cfg: Config, world_size: int) -> bool:
        return cfg.precision.name in ("bf16", "fp16")   # the engine casts the module's parameters, not buffers

    @classmethod
    def auto_layouts(cls, cfg: Config, world_size: int, per_node: int) -> list[AutoLayout]:
        """ZeRO-1 to 3 (zero=none is DDP's layout with more machinery), and 2 and 3 with the optimizer
        states in host memory."""
        if world_size == 1:
            return []
        return [AutoLayout(zero, (), world_size) for zero in (1, 2, 3)] \
            + [AutoLayout(zero, (), world_size, offload=True) for zero in (2, 3)]

    @classmethod
    def worker_preload(cls, cfg: Config) -> tuple[str, ...]:
        """DeepSpeed picks its accelerator as it is imported, so the fork server gets the workers'
        DS_ACCELERATOR first. On a GPU it is left to the workers: its import asks CUDA for devices."""
        if device_type(cfg) != "cpu":
            return ()
        _use_cpu_accelerator()
        return ("deepspeed",)

    @classmethod
    def adopt_user_files(cls, cfg: Config, world_size: int, explicit: set[str]) -> None:
        adopt(cfg, world_size, explicit)

    @classmethod
    def check(cls, cfg: Config, world_size: int) -> None:
        if cfg.trainer.on_nonfinite == "skip":
            raise ConfigError("trainer.on_nonfinite", "parallel=deepspeed cannot drop a step's gradients from its "
                                                      "ZeRO buffers; use abort (fp16 loss scaling skips overflowed "
                                                      "steps by itself) or a torch-native strategy")
        p, z = cfg.parallel, cfg.zero
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("parallel", "parallel=deepspeed needs the deepspeed package: pip install deepspeed")
        if cfg.precision.name == "fp16" and not dsc.has_fp16_hardware(cfg):
            raise ConfigError("precision", "fp16 needs CUDA: DeepSpeed's CPU accelerator has no fp16; "
                                           "use precision=bf16")
        prec = cfg.precision
        if prec.name == "fp16" and (prec.growth_factor != 2 or prec.backoff_factor != 0.5
                                    or math.log2(prec.init_scale) % 1):
            raise ConfigError("precision", "DeepSpeed's loss scaler grows x2 and backs off x0.5 from a power of "
                                           f"two; got precision.growth_factor={prec.growth_factor}, "
                                           f"backoff_factor={prec.backoff_factor}, init_scale={prec.init_scale}")
        if z.offload_optimizer and z.stage == 0:
            raise ConfigError("zero.offload_optimizer", "DeepSpeed offloads optimizer states with "
                                                        "zero=stage1, stage2 or stage3, not zero=none")
        if z.offload_params and z.stage != 3:
            raise ConfigError("zero.offload_params", f"DeepSpeed offloads parameters only with zero=stage3 "
                                                     f"(got zero.stage={z.stage})")
        if p.nvme_path:
            if not (z.offload_optimizer or z.offload_params):
                raise ConfigError("parallel.nvme_path", "is used only with zero.offload_optimizer=true or "
                                                        "zero.offload_params=true")
            if not os.path.isdir(p.nvme_path):
                raise ConfigError("parallel.nvme_path", f"no such directory: {p.nvme_path}")
        if p.use_deepspeed_optimizer and cfg.optimizer._target_ not in dsc.DS_OPTIMIZERS:
            raise ConfigError("parallel.use_deepspeed_optimizer",
                              f"DeepSpeed builds {' and '.join(dsc.DS_OPTIMIZERS)}, not {cfg.optimizer._target_}; "
                              f"use optimizer=adamw or parallel.use_deepspeed_optimizer=false")
        for knob in ("reduce_bucket_size", "allgather_bucket_size", "sub_group_size"):
            if p[knob] <= 0:
                raise ConfigError(f"parallel.{knob}", f"must be positive, got {p[knob]}")
        dsc.resolve(cfg, world_size)


class DeepSpeedStrategy(DeepSpeedTraits, Strategy):
    """The worker side of parallel=deepspeed: DeepSpeed's engine drives the model, optimizer and checkpoints."""

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        if self.device.type == "cpu":
            _use_cpu_accelerator()
        self.engine = None
        self.run_dir: Optional[str] = None   # set by the trainer; ds_config.json is written there
        self.ds_config: dict = {}

    def setup(self, model_factory, build_optimizer, build_scheduler) -> None:
        import deepspeed
        from deepspeed.utils import logger as ds_logger
        ds_logger.setLevel("WARNING")
        skip_inference_comm_op()

        self.ds_config = dsc.resolve(self.cfg, self.world_size)
        if self.is_main and self.run_dir:
            dsc.write(self.ds_config, self.run_dir)

        def engine(model):
            groups = build_optimizer.param_groups(model)
            optimizer = None if "optimizer" in self.ds_config else build_optimizer.cls(groups, **build_optimizer.kwargs)
            return deepspeed.initialize(
                model=model, optimizer=optimizer, model_parameters=groups if optimizer is None else None,
                lr_scheduler=None if "scheduler" in self.ds_config else build_scheduler, config=self.ds_config)

        # trainer.compile is refused here (compile_note): the build order's compile step does nothing
        self.engine, self.optimizer, _, self.scheduler = checkpoint_compile_wrap(
            self._build_model(model_factory), self.cfg, model_factory.spec, engine)
        self.model = self.engine
        self.dtype = compute_dtype(self.cfg.precision.name)

    def build_reference(self, model_factory) -> None:
        """The initial model in an engine of its own with the policy's ZeRO config and no optimizer (TRL's
        prepare_deepspeed): at zero=stage3 its parameters are partitioned over the ranks as the policy's are."""
        import deepspeed
        config = {k: v for k, v in self.ds_config.items() if k not in ("optimizer", "scheduler")}
        zero = dict(config.get("zero_optimization", {}))
        zero.pop("offload_optimizer", None)         # no optimizer to offload
        config["zero_optimization"] = zero
        model = self._build_model(model_factory).requires_grad_(False)
        engine, *_ = deepspeed.initialize(model=model, config=config)
        engine.eval()           # DeepSpeedEngine.eval returns None, not the engine
        self.reference_model = engine

    @contextlib.contextmanager
    def reference(self):
        if self.reference_model is None:
            yield
            return
        policy = self.engine
        self.engine = self.model = self.reference_model
        try:
            yield
        finally:
            self.engine = self.model = policy

    def _build_model(self, model_factory) -> torch.nn.Module:
        """ZeRO-3 partitions each module's parameters as it is constructed (deepspeed.zero.Init), so no rank
        holds the whole model; a spec that initialises by name then fills each rank's partitions one
        parameter at a time (from checkpoint.initial_load where given). Other models are built whole, then partitioned by the engine."""
        if self.cfg.zero.stage != 3 or not model_factory.can_materialize:
            # a model initialised whole by its own code (e.g. transformers' post-init) must see whole tensors
            return model_factory()
        import deepspeed
        deepspeed.init_distributed()   # zero.Init reads the world size from DeepSpeed's own comm layer
        with returning_large_frees():
            with deepspeed.zero.Init(config_dict_or_path=self.ds_config):
                model = model_factory.skeleton()
            self._fill_partitions(model, model_factory)
        return model

    @staticmethod
    @torch.no_grad()
    def _fill_partitions(model, model_factory) -> None:
        rank = torch.distributed.get_rank()
        for name, param in model.named_parameters():
            local = param.ds_tensor.view(-1)
            start = local.numel() * rank
            count = max(0, min(local.numel(), param.ds_numel - start))
            full = model_factory.full_parameter(name, param.ds_shape).view(-1)
            local[:count].copy_(full[start:start + count])

    def _to_device(self, batch):
        for t in batch:
            t = t.to(self.engine.device, non_blocking=True)
            yield t.to(self.dtype) if t.is_floating_point() else t

    def forward_backward(self, micro_batches, loss_fn) -> torch.Tensor:
        self.gather_batch_statistics(micro_batches, loss_fn)
        engine = self.engine
        engine.train()
        n = len(micro_batches)
        if n != engine.gradient_accumulation_steps():
            raise RuntimeError(f"{n} micro-batches per step, DeepSpeed expects {engine.gradient_accumulation_steps()}")
        total = torch.zeros((), device=engine.device)
        for i, batch in enumerate(micro_batches):
            inputs, targets, *documents = self._to_device(batch)
            with weighted_micro_batch(1 / n):
                loss = loss_fn(engine(inputs, *documents), targets)
                engine.backward(loss)    # scales by 1/accumulation steps, like the torch path's loss / n
            if i < n - 1:
                engine.step()            # not a boundary: DeepSpeed only counts the micro-step
            total += loss.detach().float()
        return self.reduce_mean(total / n)

    def optimizer_step(self, max_grad_norm: float) -> torch.Tensor:
        # The clipping limit is in the DeepSpeed config as gradient_clipping (= trainer.grad_clip).
        engine = self.engine
        self._grad_bytes = self._held_grad_bytes()
        norm = None
        if not engine.zero_optimization() and not engine.bfloat16_enabled() and not engine.fp16_enabled():
            # Plain data parallel in fp32 clips without keeping the norm; measure it (grads are reduced).
            grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
        engine.step()
        ds_norm = engine.get_global_grad_norm()
        return torch.as_tensor(ds_norm if ds_norm is not None else norm)

    @torch.no_grad()
    def eval_loss(self, micro_batches, loss_fn) -> torch.Tensor:
        self.engine.eval()
        total = torch.zeros((), device=self.engine.device)
        for batch in micro_batches:
            inputs, targets, *documents = self._to_device(batch)
            total += loss_fn(self.engine(inputs, *documents), targets).float()
        return self.reduce_mean(total / max(1, len(micro_batches)))

    def step_metrics(self) -> dict:
        if not self.engine.fp16_enabled():
            return {}
        return {"loss_scale": float(self.engine.optimizer.cur_scale), "skipped_steps": self.engine.skipped_steps}

    def current_lr(self) -> float:
        return self.engine.basic_optimizer.param_groups[0]["lr"]

    def unwrapped_model(self):
        return self.engine.module

    # ---- memory: what this rank really holds ----------------------------------------------
    def _param_tensors(self, engine=None):
        for p in (engine or self.engine).module.parameters():
            yield p.data
            if hasattr(p, "ds_tensor"):     # ZeRO-3: the local partition; p.data is empty unless gathered
                yield p.ds_tensor

    def _held_grad_bytes(self) -> int:
        """Gradients at the accumulation boundary: full .grad tensors plus ZeRO's partitioned buffers."""
        tensors = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        # With offload, ZeRO accumulates into fp32 gradient buffers of its master partitions.
        tensors += [t.grad for g in self.engine.basic_optimizer.param_groups for t in g["params"]
                    if t.grad is not None]
        opt = self.engine.optimizer
        for attr in ("averaged_gradients", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"):
            held = getattr(opt, attr, None)
            if isinstance(held, dict):
                for v in held.values():
                    tensors += v if isinstance(v, list) else [v]
        seen, total = set(), 0
        for t in tensors:
            if torch.is_tensor(t) and t.numel() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += local_bytes(t)
        return total

    def memory_breakdown(self) -> dict[str, int]:
        params = [t for t in self._param_tensors() if t.numel()]
        model_ptrs = {t.data_ptr() for t in params}
        basic = self.engine.basic_optimizer
        # ZeRO and the bf16 optimizer step fp32 copies of this rank's partition: master weights
        # (ZeRO-3 in fp32 steps the parameter partition itself: no copy, nothing counted).
        masters = [t for g in basic.param_groups for t in g["params"] if t.numel() and t.data_ptr() not in model_ptrs]
        state = [t for s in basic.state.values() for t in s.values() if torch.is_tensor(t)]
        return {
            "param_bytes": sum(local_bytes(t) for t in params),
            "grad_bytes": self._grad_bytes,
            "optim_state_bytes": sum(local_bytes(t) for t in state),
            "master_param_bytes": sum(local_bytes(t) for t in masters),
            **({"reference_bytes": sum(local_bytes(t) for t in self._param_tensors(self.reference_model) if t.numel())}
               if self.reference_model is not None else {}),
        }

    # ---- checkpoints: DeepSpeed's own format, one step directory --------------------------
    def save_checkpoint(self, path: str) -> None:
        parent, tag = os.path.split(os.path.abspath(path))
        self.engine.save_checkpoint(parent, tag=tag, save_latest=False)

    def load_checkpoint(self, path: str) -> None:
        parent, tag = os.path.split(os.path.abspath(path))
        with restricted_engine_load(self.engine):
            loaded, _ = self.engine.load_checkpoint(parent, tag=tag, load_optimizer_states=True,
                                                    load_lr_scheduler_states=True)
        if loaded is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {path}")

    def full_model_state_dict(self) -> dict | None:
        """fp32 weights from the optimizer's master copies (all ranks take part in the gathers)."""
        from deepspeed.utils import safe_get_full_fp32_param
        out = {}
        for name, p in self.engine.module.named_parameters(remove_duplicate=False):
            full = safe_get_full_fp32_param(p)
            if full is None:   # no master copy: fp32 without ZeRO, the module holds the weights
                full = p.detach()
            if self.is_main:
                out[name] = full.detach().float().cpu().clone()
        return out if self.is_main else None

    def teardown(self) -> None:
        if self.engine is not None and hasattr(self.engine, "destroy"):
            self.engine.destroy()
        self.engine = None
        super().teardown()
