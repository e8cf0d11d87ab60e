"""A DeepSpeed resume that unpickles nothing of the checkpoint but weights only.

engine.load_checkpoint reads the step's files through the engine's `checkpoint_engine` attribute, whose
TorchCheckpointEngine.load calls torch.load(weights_only=False). On DeepSpeed 0.19's load path:
- `mp_rank_00_model_states.pt` (zero 0-2) or each `zero_pp_rank_N_mp_rank_00_model_states.pt` (zero 3):
  the module's weights, and zero 0's optimizer; read by the state-dict loader (SDLoaderFactory) through
  checkpoint_engine.load, in every precision;
- `[bf16_]zero_pp_rank_N_mp_rank_00_optim_states.pt` (zero 1-3; the bf16_ prefix in bf16): the rank's
  optimizer partition, through checkpoint_engine.load in _get_all_zero_checkpoint_state_dicts;
- DeepSpeed-MoE expert files and their optimizer files, through checkpoint_engine.load (this framework's
  MoE models are not DeepSpeed-MoE layers and write none);
- universal checkpoints (`load_universal`, which the framework never writes) call torch.load directly.
`restricted_engine_load` swaps in a checkpoint engine whose load is checkpoint/deepspeed_files.py's
(one refusal names its file), and runs the whole call inside `deepspeed_loads_restricted`, which makes any
torch.load outside that engine weights-only too.
"""
from __future__ import annotations

import contextlib

from framework.checkpoint.deepspeed_files import deepspeed_loads_restricted, load_deepspeed_file


class RestrictedCheckpointEngine:
    """DeepSpeed's checkpoint engine with a weights-only load; everything else is the engine's own."""

    def __init__(self, engine):
        self._engine = engine

    def load(self, path: str, map_location=None):
        return load_deepspeed_file(path, map_location=map_location)     # as DeepSpeed passes it

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


@contextlib.contextmanager
def restricted_engine_load(engine):
    """Inside: `engine.load_checkpoint` reads its files weights only."""
    own = engine.checkpoint_engine
    engine.checkpoint_engine = RestrictedCheckpointEngine(own)
    try:
        with deepspeed_loads_restricted():
            yield
    finally:
        engine.checkpoint_engine = own
