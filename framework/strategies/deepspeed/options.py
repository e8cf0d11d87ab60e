"""parallel.* for parallel=deepspeed: read by the strategy and by the DeepSpeed JSON generator alike."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from framework.config.schema import ParallelConfig


@dataclass
class DeepSpeedOptions(ParallelConfig):
    """parallel.* for DeepSpeed. Knob defaults are DeepSpeed's own (None: DeepSpeed picks per stage)."""
    name: str = "deepspeed"
    overlap_comm: Optional[bool] = None     # overlap gradient reduction with backward; null = DeepSpeed's default
    contiguous_gradients: bool = True       # copy gradients into one contiguous buffer as they are made
    reduce_scatter: bool = True             # reduce gradients with reduce-scatter rather than all-reduce
    reduce_bucket_size: int = 500_000_000   # elements reduced at a time
    allgather_partitions: bool = True       # all-gather updated partitions (else broadcasts)
    allgather_bucket_size: int = 500_000_000  # elements all-gathered at a time
    round_robin_gradients: bool = False     # stage 1-2 offload: spread gradient copies over ranks in turn
    sub_group_size: int = 1_000_000_000     # stage 3: parameters per optimizer-step sub-group
    stage3_prefetch_bucket_size: int = 50_000_000  # stage 3: elements prefetched ahead of use
    stage3_param_persistence_threshold: int = 100_000  # stage 3: parameters smaller than this stay whole
    stage3_max_live_parameters: int = 1_000_000_000  # stage 3: gathered parameters held at once
    stage3_max_reuse_distance: int = 1_000_000_000  # stage 3: keep a parameter gathered if reused within this
    stage3_gather_16bit_weights_on_model_save: bool = False  # stage 3: gather whole 16-bit weights at save
    pin_memory: bool = False                # page-locked offload buffers (pays off with CUDA)
    nvme_path: Optional[str] = None         # offload to NVMe under this directory instead of CPU memory
    # precision=fp16: DeepSpeed's extras to precision.init_scale / growth_interval
    hysteresis: int = 2                     # overflows tolerated before the scale backs off
    min_loss_scale: float = 1.0             # fp16: the loss scale never goes below this
    use_deepspeed_optimizer: bool = False   # DeepSpeed builds Adam(W) itself (DeepSpeedCPUAdam when offloading)
    ds_config: Optional[str] = None         # an existing DeepSpeed JSON to reconcile with the run
    # extra DeepSpeed keys merged last: +parallel.overrides.wall_clock_breakdown=true, or
    # ++parallel.overrides={...}; a null deletes a key of the ds_config file
    overrides: Dict[str, Any] = field(default_factory=dict)
