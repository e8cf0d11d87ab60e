"""parallel=deepspeed: ZeRO stages 0-3 with CPU or NVMe offload, its JSON generated from the run's groups.

The public API is what this file imports; the modules behind it:
  strategy.py  the Strategy (deepspeed itself is imported only inside the workers)
  options.py   parallel.* for DeepSpeed
  adopt.py     before validation, a user's JSON (parallel.ds_config) sets what the user left at our defaults
  config.py    the run's DeepSpeed JSON: generated, reconciled with the user's file, written to the run dir
  ops.py       which Adam kernel DeepSpeed's own optimizer runs on CUDA
  values.py    reading and comparing values at a path of a DeepSpeed JSON ("auto", a missing key)
"""
from framework.strategies.deepspeed.adopt import adopt
from framework.strategies.deepspeed.config import resolve, write
from framework.strategies.deepspeed.options import DeepSpeedOptions
from framework.strategies.deepspeed.strategy import DeepSpeedStrategy

__all__ = ["DeepSpeedOptions", "DeepSpeedStrategy", "adopt", "resolve", "write"]
