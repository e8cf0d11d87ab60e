"""The precision plug-in of torch-native strategies: autocast, loss scaling and the scaled step.

fp32 is the identity. bf16 and fp16 run the forward under torch.autocast (parameters, gradients
and optimizer states stay fp32), except bf16 with precision.store_dtype=bfloat16, whose parameters are bf16
already (no autocast); fp16 adds dynamic loss scaling, whose skipped steps are counted.
float8 is bf16 autocast around blocks whose linears torchao converts (framework/parallel/float8.py).
Strategies that express precision in their own terms (FSDP2's MixedPrecisionPolicy, DeepSpeed's
bf16/fp16 sections) build the plug-in with autocast=False and keep only its loss scaling.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.runtime import devices

#: precision.name -> the compute dtype it means (precision.param_dtype must agree)
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "float8": "bfloat16"}
FLOAT8_RECIPES = ("tensorwise", "rowwise")
#: dtype name (precision.param_dtype / reduce_dtype) -> torch dtype; the one such map in the framework
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: precision.store_dtype: what parameters (so gradients and optimizer states) are held in; bfloat16 only with bf16
STORE_DTYPES = ("float32", "bfloat16")


def compute_dtype(name: str) -> torch.dtype:
    """The torch dtype precision=<name> computes in (fp32 | bf16 | fp16)."""
    return DTYPES[COMPUTE_DTYPES[name]]


def validate_precision(cfg) -> None:
    p = cfg.precision
    if p.name not in COMPUTE_DTYPES:
        raise ConfigError("precision", f"unknown precision {p.name!r}; use {', '.join(COMPUTE_DTYPES)}")
    for key in ("param_dtype", "reduce_dtype"):
        if getattr(p, key) not in DTYPES:
            raise ConfigError(f"precision.{key}", f"unknown dtype {getattr(p, key)!r}; use {', '.join(DTYPES)}")
    if p.param_dtype != COMPUTE_DTYPES[p.name]:
        raise ConfigError("precision.param_dtype", f"precision={p.name} computes in {COMPUTE_DTYPES[p.name]}, "
                                                   f"not {p.param_dtype}; pick the precision group instead")
    if stores_bf16(p):
        validate_bf16_parameters(cfg)
    kind = devices.device_type(cfg)
    if p.name != "fp32" and not compute_supported(DTYPES[p.param_dtype], kind):
        index = devices.local_gpu()
        where = f"GPU {index} ({torch.cuda.get_device_name(index)})" if kind == "cuda" else "this cpu"
        alternative = "fp16 or fp32" if p.name == "bf16" and kind == "cuda" else \
            f"fp32{' or bf16' if p.name == 'fp16' else ''}"
        raise ConfigError("precision", f"{where} cannot train in {p.param_dtype} natively; "
                                       f"use precision={alternative}")
    if p.name == "float8":
        validate_float8(p, kind)
    else:
        # the schema's defaults where the config is typed (composed by Hydra); a config read back from a run's
        # resolved YAML (a cluster node's) is plain and was checked where it was composed
        schema = OmegaConf.get_type(p) if OmegaConf.is_config(p) else None
        defaults = {f.name: f.default for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
        for key in ("float8_recipe", "float8_emulate"):
            if key in defaults and p[key] != defaults[key]:
                raise ConfigError(f"precision.{key}", f"applies to precision=float8, not precision={p.name}; drop it "
                                                      f"or set precision=float8")
    if p.name == "fp16":
        if p.init_scale <= 0 or p.growth_factor <= 1 or not 0 < p.backoff_factor < 1 or p.growth_interval <= 0:
            raise ConfigError("precision", "loss scaling needs init_scale > 0, growth_factor > 1, "
                                           "0 < backoff_factor < 1 and growth_interval > 0")


def stores_bf16(precision) -> bool:
    """precision.store_dtype=bfloat16: parameters, gradients and optimizer states in bf16, no fp32 master."""
    return precision.get("store_dtype") == "bfloat16"


def validate_bf16_parameters(cfg) -> None:
    if cfg.precision.name != "bf16":
        raise ConfigError("precision.store_dtype", f"bfloat16 parameters compute in bf16, not in "
                                                   f"precision={cfg.precision.name}; set precision=bf16")
    lora = cfg.get("lora")
    if lora is not None and lora.enabled:
        raise ConfigError("precision.store_dtype", "adapters train in fp32 on their frozen base; keep "
                                                   "precision.store_dtype=float32 (lora.base_dtype=bfloat16 "
                                                   "stores the base in bf16)")


def validate_float8(p, kind: str) -> None:
    import importlib.util
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("precision", "precision=float8 needs torchao: pip install 'framework[float8]'")
    if p.float8_emulate:
        return
    capability = torch.cuda.get_device_capability(devices.local_gpu()) if kind == "cuda" else None
    if capability is None or capability < (8, 9):
        where = f"GPU compute capability {capability[0]}.{capability[1]}" if capability else "the cpu"
        raise ConfigError("precision", f"{where} has no float8 matmuls (CUDA 8.9+: Ada, Hopper, Blackwell); use "
                                       f"precision=bf16 (precision.float8_emulate=true only checks numerics, slowly)")


@functools.cache
def compute_supported(dtype: torch.dtype, device_type: str) -> bool:
    """Whether a matmul forward and backward runs in `dtype` here (CPU fp16 kernels depend on the build)."""
    if device_type == "cuda":
        return dtype != torch.bfloat16 or devices.native_bf16(devices.local_gpu())
    try:
        x = torch.ones(4, 4, requires_grad=True)
        with torch.autocast(device_type, dtype=dtype):
            y = x @ x
        y.float().sum().backward()
        return y.dtype == dtype and bool(torch.isfinite(x.grad).all())
    except RuntimeError:
        return False


class Precision:
    def __init__(self, cfg, device: torch.device):
        self.cfg = cfg
        self.device = device

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer) -> None:
        """Make the gradients true gradients before clipping."""

    def step(self, optimizer) -> bool:
        """Step the optimizer; False when the step was skipped (e.g. inf/nan under loss scaling)."""
        optimizer.step()
        return True

    def metrics(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class AutocastPrecision(Precision):
    """Low-precision compute under torch.autocast; fp32 parameters, gradients and optimizer states."""

    def __init__(self, cfg, device: torch.device, dtype: torch.dtype):
        super().__init__(cfg, device)
        self.dtype = dtype

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype)


class LossScaling(Precision):
    """Dynamic loss scaling: scale the loss, unscale gradients, skip the step on inf/nan and back
    off the scale; grow it after `growth_interval` clean steps.

    ShardedGradScaler is torch's GradScaler that all-reduces the inf/nan flag, so ranks holding
    different gradient shards agree on skipping (a no-op cost for replicated gradients).
    """

    def __init__(self, cfg, device: torch.device, inner: Precision):
        super().__init__(cfg, device)
        self.inner = inner
        self._scaler = None
        self.skipped_steps = 0

    @property
    def scaler(self) -> torch.amp.GradScaler:
        # Built on first use: the plug-in exists before the process group does.
        if self._scaler is None:
            p = self.cfg.precision
            kwargs = dict(init_scale=p.init_scale, growth_factor=p.growth_factor,
                          backoff_factor=p.backoff_factor, growth_interval=p.growth_interval)
            if dist.is_available() and dist.is_initialized():
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
                self._scaler = ShardedGradScaler(device=self.device.type, **kwargs)
            else:
                self._scaler = torch.amp.GradScaler(self.device.type, **kwargs)
        return self._scaler

    def autocast(self):
        return self.inner.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # update() backs the scale off exactly when the step found inf/nan and was skipped.
        skipped = self.scaler.get_scale() < scale
        self.skipped_steps += skipped
        return not skipped

    def metrics(self) -> dict:
        return {"loss_scale": self.scaler.get_scale(), "skipped_steps": self.skipped_steps}

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
            self.skipped_steps = state.get("skipped_steps", 0)


def build_precision(cfg, device: torch.device, autocast: bool = True) -> Precision:
    """The plug-in for `precision.name`; autocast=False when the strategy casts parameters itself."""
    name = cfg.precision.name
    plugin = Precision(cfg, device)
    if name != "fp32" and autocast and not stores_bf16(cfg.precision):
        plugin = AutocastPrecision(cfg, device, compute_dtype(name))
    if name == "fp16":
        plugin = LossScaling(cfg, device, plugin)
    return plugin
