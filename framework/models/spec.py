"""A model spec: everything the rest of the framework may know about a model family.

Generic code (trainer, strategies, checkpoints, export, validation) asks the spec of `model._target_`
and never names a model class. A spec supplies: build (under whatever device context the caller sets,
meta included), per-parameter init from (seed, name) so a rank can fill one shard alone, the
tensor-parallel plan, the pipeline split, the block classes (activation checkpointing and FSDP units),
FLOPs per token, a parameter count from shapes alone, and a state-dict adapter to and from the
Hugging Face layout.

Adding a family: a spec module with a `SPEC` object (a ModelSpec subclass instance) and one line in
SPECS below. A `_target_` the registry does not know (any nn.Module mapping token ids to logits) gets
GENERIC: built on every rank from torch's global seed, no tensor or pipeline parallelism.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Optional

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from framework.errors import ConfigError

#: family name -> "module:attribute" of its spec; imported only when a model of the family is used
SPECS: dict[str, str] = {
    "llama": "framework.models.llama.spec:SPEC",
    "gpt2": "framework.models.gpt2.spec:SPEC",
    "hf": "framework.models.hf.spec:SPEC",
    "moe": "framework.models.moe.spec:SPEC",
}


def register(name: str, path: str) -> None:
    """Another model family under `name` (a plugin or a test): `path` is "module:attribute" of its spec."""
    SPECS[name] = path


def model_dict(model_cfg) -> dict:
    """The model config section as a plain dict (keeps _target_)."""
    if isinstance(model_cfg, DictConfig):
        return OmegaConf.to_container(model_cfg, resolve=True)
    return dict(model_cfg)


class ModelSpec:
    """The defaults are those of a model the framework knows nothing about; families override them."""
    name = "generic"
    #: True where init_parameter fills any parameter from (seed, name): sharded layouts then build on
    #: the meta device and each rank materialises only its own shards
    init_by_name = False
    #: True where the model takes its token positions from framework.models.positions and attends through
    #: causal scaled_dot_product_attention: context parallelism can then split its sequences
    context_parallel = False
    #: True where forward(tokens, documents) keeps attention within packed documents and restarts their
    #: positions (framework.models.documents): data.document_mask can then pack them
    takes_documents = False

    def config_schema(self) -> Optional[type]:
        """The dataclass that types `model.*` (stored as schema/model/<name> for the yaml files)."""
        return None

    def model_class(self) -> Optional[type]:
        """The nn.Module class this spec describes (subclasses match too); None for GENERIC."""
        return None

    # ---- build and init ---------------------------------------------------------------------
    def build(self, model_cfg, load_weights: bool = True) -> nn.Module:
        """The full model, created under the caller's device context (torch.device("meta") included);
        with load_weights=False a model that brings its own weights (weights_dir) does not read them."""
        return instantiate(model_dict(model_cfg), _convert_="all")

    def prepare(self, model_cfg) -> None:
        """Import what build needs, before any construction context (deepspeed.zero.Init patches tensor
        creation, which modules imported inside it may not survive)."""

    def worker_modules(self, model_cfg) -> tuple[str, ...]:
        """What a worker imports to build this model, beyond the framework itself (see
        framework.launch.preload)."""
        return ()

    def meta_skeleton(self, model_cfg) -> nn.Module:
        """The model with its parameters on the meta device, for a rank to allocate and fill shard by shard."""
        with torch.device("meta"):
            return self.build(model_cfg, load_weights=False)

    def weights_dir(self, model_cfg) -> Optional[str]:
        """An HF-layout dir the model's own weights come from (model=hf's pretrained); None: initialised."""
        return None

    def init_parameter(self, model_cfg, name: str, tensor: torch.Tensor, seed: int) -> None:
        """Fill the full-size parameter `name` in place from (seed, name)."""
        raise NotImplementedError(f"{self.name} models are initialised by torch's global seed, not by name")

    @torch.no_grad()
    def init_weights(self, model: nn.Module, model_cfg, seed: int) -> None:
        """Seeded init of a built (unsharded) model; a no-op where torch's seeded init at build is the init."""
        if self.init_by_name:
            for name, p in model.named_parameters():
                self.init_parameter(model_cfg, name, p, seed)

    def tied_parameters(self, model_cfg) -> tuple[tuple[str, str], ...]:
        """(canonical, alias) names of one parameter used in two places, e.g. an output head tied to the
        embedding. Split across pipeline stages, the alias becomes its own copy, initialised (and loaded)
        as the canonical and kept equal to it by summing their gradients; tensor parallelism re-ties them
        after sharding."""
        return ()

    # ---- parallel plans -----------------------------------------------------------------------
    def tensor_parallel_plan(self, model: nn.Module, sequence_parallel: bool) -> Optional[dict]:
        """Module name -> DTensor ParallelStyle for the modules `model` (perhaps one stage) holds; None: no TP."""
        return None

    supports_pipeline = False
    #: MoE layers whose experts parallel.ep may shard (framework/parallel/expert_parallel.py)
    has_experts = False
    #: names (or dotted suffixes) of the blocks' linears precision=float8 leaves in high precision
    float8_kept: tuple[str, ...] = ()

    def num_layers(self, model_cfg) -> int:
        """How many repeated blocks a pipeline splits (only asked where supports_pipeline)."""
        raise NotImplementedError

    def with_layers(self, model_cfg, n_layers: int):
        """The same model config with `n_layers` identical blocks, or None where blocks are not all alike
        or the count is not the config's to set (the planner then traces the whole model)."""
        return None

    def pipeline_stage(self, model: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
        """A copy of `model` holding only that stage's part, under the full model's parameter names."""
        raise NotImplementedError(f"{self.name} models have no pipeline split")

    def merge_stages(self, stages: list[nn.Module]) -> nn.Module:
        """One module over a rank's stages with the full model's parameter names (for state dicts):
        top-level children are taken from the stage holding them, ModuleDicts of blocks are merged."""
        merged = nn.Module()
        for stage in stages:
            for child_name, child in stage.named_children():
                if isinstance(child, nn.ModuleDict):
                    if not hasattr(merged, child_name):
                        setattr(merged, child_name, nn.ModuleDict())
                    getattr(merged, child_name).update(child)
                else:
                    setattr(merged, child_name, child)
        return merged

    def block_classes(self, model: nn.Module) -> tuple[type, ...]:
        """The repeated blocks: FSDP units and what activation checkpointing recomputes."""
        own = getattr(model, "block_classes", None)
        return tuple(own()) if callable(own) else ()

    def output_heads(self) -> tuple[str, ...]:
        """Names of the modules that turn hidden states into logits: optimizer=muon leaves them to AdamW."""
        return ("lm_head",)

    def lora_skip(self) -> tuple[str, ...]:
        """Regular expressions of the block linears LoRA leaves alone (an MoE router)."""
        return ()

    def has_blocks(self, model_cfg) -> bool:
        """Whether block_classes is known before the model is built (validation)."""
        return callable(getattr(get_class(model_dict(model_cfg)["_target_"]), "block_classes", None))

    # ---- sizes --------------------------------------------------------------------------------
    def num_params(self, model_cfg) -> int:
        """From the shapes alone: the model is built on the meta device (no memory, no init)."""
        with torch.device("meta"):
            model = self.build(model_cfg)
        return sum(p.numel() for p in model.parameters())

    def flops_per_token(self, model_cfg, seq_len: int) -> float:
        """Training FLOPs per token; 6N for a model whose attention cost is unknown."""
        return 6.0 * self.num_params(model_cfg)

    def active_params(self, model_cfg) -> int:
        """Parameters one token computes with (fewer than num_params where experts are routed)."""
        return self.num_params(model_cfg)

    def dispatch_elements(self, model_cfg) -> int:
        """Elements one token sends to its experts per MoE layer (expert-parallel all-to-all); 0: dense."""
        return 0

    # ---- training -----------------------------------------------------------------------------
    def batch_statistics(self, model_cfg):
        """None, or what a model whose training loss reads statistics of the whole global batch gathers them
        with: an object whose `gathering(device)` context the strategy runs a forward of each of the step's
        micro-batches in, without gradient, on every rank, before the step's training forwards."""
        return None

    # ---- metrics ------------------------------------------------------------------------------
    def step_metrics(self, model: nn.Module) -> dict:
        """Numbers of the model itself for the last step's metrics record (e.g. MoE expert loads); every
        rank calls it on the steps the trainer logs."""
        return {}

    # ---- checks (launching process, before any worker) ----------------------------------------
    def validate(self, cfg) -> None:
        """Rules on cfg.model and how it meets the data; raise ConfigError."""

    def validate_layout(self, cfg, tp: int, pp: int) -> None:
        """Whether this model can be split tp ways (tensor) and pp ways (pipeline)."""
        target = model_dict(cfg.model)["_target_"]
        if tp > 1:
            raise ConfigError("parallel.tp", f"{target} has no tensor-parallel plan (model spec {self.name}); "
                                             f"use parallel.tp=1 or a model with one (llama, gpt2)")
        if pp > 1 and not self.supports_pipeline:
            raise ConfigError("parallel.pp", f"{target} has no pipeline split (model spec {self.name}); "
                                             f"use parallel.pp=1 or a model with one (llama, gpt2)")

    # ---- Hugging Face layout ------------------------------------------------------------------
    has_hf_layout = False
    #: config.json's model_type of the Hugging Face models this family reads and writes
    hf_model_type: Optional[str] = None

    def reads_hf(self, model_type) -> bool:
        """Whether this family reads Hugging Face models of config.json's `model_type`."""
        return bool(self.hf_model_type) and self.hf_model_type == model_type

    def model_cfg_from_hf(self, hf_config: dict) -> dict:
        """The model config (with _target_) whose shapes match an HF config.json (generation from an export)."""
        raise NotImplementedError(f"{self.name} models have no Hugging Face layout")

    def context_length(self, model_cfg) -> Optional[int]:
        """The longest sequence the model takes (None: no limit known)."""
        return model_dict(model_cfg).get("max_seq_len")

    def hf_config(self, model_cfg) -> dict:
        """config.json of the Hugging Face model these weights load into."""
        raise NotImplementedError(f"{self.name} models have no Hugging Face layout")

    def to_hf(self, state: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
        """A full fp32 state dict in our names -> HF names and layout (contiguous, for save_file)."""
        raise NotImplementedError(f"{self.name} models have no Hugging Face layout")

    def hf_linear(self, name: str, rows: torch.Tensor, model_cfg) -> tuple[str, torch.Tensor]:
        """One linear's weight (or a tensor shaped like its rows: a LoRA B) -> (its HF weight name, the rows in
        HF's order); raises hf_files.LayoutError where the linear has no HF linear of its own."""
        from framework.models.hf_files import LayoutError
        raise LayoutError(f"{name} has no Hugging Face linear of its own (model spec {self.name})")

    def hf_mismatches(self, hf_config: dict, model_cfg) -> list[tuple[str, str, Any, Any]]:
        """(config.json key, model key, theirs, ours) for each shape-relevant difference."""
        raise NotImplementedError(f"{self.name} models have no Hugging Face layout")

    def hf_function_values(self, hf_config: dict) -> list[tuple[str, str, Any]]:
        """(config.json key, model key, value) for each key that changes what the model computes but no
        shape (norm epsilon, RoPE): checkpoint.initial_load takes them unless the command line sets them.
        Raises hf_files.LayoutError for a config this family cannot compute."""
        return []

    def hf_weights(self, path: str, model_cfg):
        """A reader of an HF-layout dir: .full(our name) -> fp32 tensor, .shape_errors() -> [str]."""
        raise NotImplementedError(f"{self.name} models have no Hugging Face layout")


GENERIC = ModelSpec()


def spec_named(name: str) -> ModelSpec:
    if name not in SPECS:
        raise ConfigError("model", f"no model spec named {name!r}; registered: {', '.join(SPECS)}")
    module, attr = SPECS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def spec_for_hf(hf_config: dict) -> ModelSpec:
    """The spec whose Hugging Face model_type is config.json's."""
    for name in SPECS:
        spec = spec_named(name)
        if spec.reads_hf(hf_config.get("model_type")):
            return spec
    raise ConfigError("model", f"no model spec reads Hugging Face model_type={hf_config.get('model_type')!r}")


def spec_for(model_cfg) -> ModelSpec:
    """The spec whose model class is `model._target_` or its nearest base (a variant's own spec before
    its base family's: MoETransformer is a Llama); GENERIC if none is. It depends on `_target_` alone: found
    once per process for each target (and registry), however many of a job's pieces ask."""
    return _spec_of_target(model_cfg["_target_"], tuple(SPECS.items()))


@functools.lru_cache(maxsize=None)
def _spec_of_target(target: str, registry: tuple[tuple[str, str], ...]) -> ModelSpec:
    cls = get_class(target)
    if not isinstance(cls, type):
        return GENERIC
    mro = cls.__mro__
    found = [(mro.index(own), spec) for spec in map(spec_named, dict(registry))
             if (own := spec.model_class()) is not None and own in mro]
    return min(found, key=lambda pair: pair[0])[1] if found else GENERIC
