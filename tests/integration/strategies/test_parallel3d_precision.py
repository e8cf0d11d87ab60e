"""parallel=3d in bf16 shards with the same FSDP2 MixedPrecisionPolicy as parallel=fsdp: parameters
all-gathered and stage activations sent in bf16, gradients reduced in precision.reduce_dtype."""
import re
import math
from types import SimpleNamespace

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from framework.strategies import parallel3d
from tests.harness.helpers import FAST, SAVE_LAST, check_ok, losses, run_framework
from tests.harness.parity import assert_parity


def _policy_3d_applies(compose_config, *args):
    cfg = compose_config([*FAST, "parallel=3d", *args])
    strategy = parallel3d.Parallel3DStrategy.__new__(parallel3d.Parallel3DStrategy)
    strategy.cfg = cfg
    plan = strategy.sharding(SimpleNamespace(dp=2, fsdp_size=2))
    assert plan.enabled and plan.reshard_after_forward == (cfg.zero.stage == 3)
    return plan.mp_policy


def test_3d_passes_the_fsdp_mixed_precision_policy(compose_config):
    assert _policy_3d_applies(compose_config, "precision=bf16") == \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert _policy_3d_applies(compose_config, "precision=bf16", "precision.reduce_dtype=bfloat16") == \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert _policy_3d_applies(compose_config) == MixedPrecisionPolicy()


def test_bf16_pipeline_over_sharded_data_parallel_sends_bf16_and_tracks_fp32(tmp_path, reference_run):
    """pp=2 x dp_shard=2: FSDP2 casts each stage's parameters to bf16, so the activations the stages
    send each other are bf16 too (they were fp32 under autocast alone)."""
    run_dir = tmp_path / "3d_bf16"
    proc = run_framework([*FAST, SAVE_LAST, "parallel=3d", "parallel.tp=1", "parallel.pp=2", "parallel.dp_shard=2",
                          "zero=stage3", "precision=bf16"], run_dir, torchrun_nproc=4,
                         module="tests.fixtures.pipeline_sends")
    check_ok(proc)
    # ranks print concurrently, so two records can share a line: match records, not lines
    assert set(re.findall(r"SEND (\d+) (torch\.[a-z0-9]+)", proc.stdout)) == {("0", "torch.bfloat16")}
    got = losses(run_dir)
    assert all(math.isfinite(x) for x in got) and got[-1] < got[0]
    assert assert_parity(run_dir, reference_run())["kind"] == "bf16"
