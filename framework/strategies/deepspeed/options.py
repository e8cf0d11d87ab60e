"""parallel.* for parallel=deepspeed: read by the strategy and by the DeepSpeed JSON generator alike."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from framework.config.schema import ParallelConfig


@dataclass
class DeepSpeedOptions(ParallelConfig):
    """parallel.* for DeepSpeed. Knob defaults are DeepSpeed's own (None: DeepSpeed picks per stage)."""
    name: str = "deepspeed"
    overlap_comm: Optional[bool] = None
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_partitions: bool = True
    allgather_bucket_size: int = 500_000_000
    round_robin_gradients: bool = False
    sub_group_size: int = 1_000_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_gather_16bit_weights_on_model_save: bool = False
    pin_memory: bool = False                # page-locked offload buffers (pays off with CUDA)
    nvme_path: Optional[str] = None         # offload to NVMe under this directory instead of CPU memory
    # precision=fp16: DeepSpeed's extras to precision.init_scale / growth_interval
    hysteresis: int = 2                     # overflows tolerated before the scale backs off
    min_loss_scale: float = 1.0
    use_deepspeed_optimizer: bool = False   # DeepSpeed builds Adam(W) itself (DeepSpeedCPUAdam when offloading)
    ds_config: Optional[str] = None         # an existing DeepSpeed JSON to reconcile with the run
    # extra DeepSpeed keys merged last: +parallel.overrides.wall_clock_breakdown=true, or
    # ++parallel.overrides={...}; a null deletes a key of the ds_config file
    overrides: Dict[str, Any] = field(default_factory=dict)
