"""Bad parallel=3d degrees and schedules stop in the launching process: exit 2, one line naming the key,
no worker started. The real entrypoint for the first cases; the rest through the same validate() in-process."""
import pytest

from tests.harness.helpers import derive_and_validate
from framework.errors import ConfigError
from framework.launch import admission
from framework.parallel.mesh import ParallelDims
from framework.runtime import world
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, run_framework

CASES = {
    "product_is_not_world_size": (["parallel.tp=2", "parallel.pp=2", "parallel.dp_shard=2",
                                   "launcher.nproc_per_node=4"], "parallel", "= 8 processes, but the world size is 4"),
    "two_rest_degrees": (["parallel.tp=-1", "parallel.dp_shard=-1"], "parallel.tp", "only one degree may be -1"),
    "rest_does_not_divide": (["parallel.tp=4", "parallel.pp=1", "parallel.dp_shard=-1", "launcher.nproc_per_node=6"],
                             "parallel.dp_shard", "world size 6"),
    "zero_degree": (["parallel.pp=0"], "parallel.pp", "got 0"),
    "kv_heads_not_divisible_by_tp": (["parallel.tp=4", "parallel.pp=1", "parallel.dp_shard=1"],
                                     "model.n_kv_heads", "2 attention heads do not divide among parallel.tp=4"),
    "layers_not_divisible_by_stages": (["parallel.tp=1", "parallel.dp_shard=1", "parallel.pp_schedule=Interleaved1F1B",
                                        "parallel.pp_virtual_stages=2"], "model.n_layers",
                                       "2 layers do not divide into pp x pp_virtual_stages = 2 x 2 = 4"),
    "unknown_schedule": (["parallel.pp_schedule=Wavefront"], "parallel.pp_schedule", "unknown schedule 'Wavefront'"),
}

IN_PROCESS_CASES = {
    "too_few_microbatches_for_1f1b": (["parallel.pp=4", "parallel.tp=1", "parallel.dp_shard=1", "model.n_layers=4",
                                       "parallel.pp_microbatches=2"], "parallel.pp_microbatches",
                                      "needs at least 4 micro-batches with parallel.pp=4, got 2"),
    "virtual_stages_on_single_stage_schedule": (["parallel.pp_schedule=GPipe", "parallel.pp_virtual_stages=2"],
                                                "parallel.pp_virtual_stages", "one stage per rank"),
    "batch_share_not_divisible_into_microbatches": (["parallel.pp_microbatches=3"], "parallel.pp_microbatches",
                                                    "4 sequences (8 / dp 2) do not split into 3"),
    "global_batch_not_divisible_by_dp": (["parallel.tp=1", "parallel.pp=1", "parallel.dp_shard=3",
                                          "trainer.micro_batch_size=1"], "trainer.global_batch_size",
                                         "8 sequences do not divide among 3 data-parallel ranks"),
    # without a pipeline the micro-batches must be equal: [3, 1] would weigh one sequence like three
    "micro_batch_does_not_divide_a_share": (["parallel.tp=2", "parallel.pp=1", "parallel.dp_shard=2",
                                             "trainer.micro_batch_size=3"], "trainer.global_batch_size",
                                            "8 is not divisible by micro_batch_size x data-parallel degree = 3 x 2"),
    "zero_stage1_refused": (["zero=stage1"], "zero", "use zero=stage2"),
    "every_other_matmul_without_kept_matmuls": (["activation_checkpointing=full",
                                                 "activation_checkpointing.save_every_nth_matmul=2"],
                                                "activation_checkpointing.save_every_nth_matmul",
                                                "applies where matmul outputs are kept"),
    "every_0th_matmul": (["activation_checkpointing=selective", "activation_checkpointing.mode=op",
                          "activation_checkpointing.save_every_nth_matmul=0"],
                         "activation_checkpointing.save_every_nth_matmul", "must be at least 1, got 0"),
    "split_backward_with_document_mask": (["parallel.pp_schedule=DualPipeV", "parallel.pp_virtual_stages=2",
                                           "parallel.tp=1", "parallel.dp_shard=2", "launcher.nproc_per_node=4",
                                           "parallel.pp_microbatches=4", "model.n_layers=4", "data.document_mask=true"],
                                          "data.document_mask",
                                          "torch's weight half fails on the document mask's attention"),
    # the shared checks run under 3d too: this once reached the workers and divided by zero there
    "selective_every_0_layers": (["activation_checkpointing=selective", "activation_checkpointing.every_n_layers=0"],
                                 "activation_checkpointing.every_n_layers", "must be at least 1, got 0"),
}


@pytest.mark.parametrize("case", CASES)
def test_invalid_layout_fails_before_any_worker(tmp_path, case):
    args, key, fragment = CASES[case]
    run_dir = tmp_path / "run"
    proc = run_framework([*FAST, "parallel=3d", *args], run_dir, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {key}: "), lines[0]
    assert fragment in lines[0]
    assert not (run_dir / "config.yaml").exists()       # the parent writes it just before starting workers


@pytest.fixture(scope="module")
def composer(compose_config):
    return lambda *args: compose_config([*FAST, "parallel=3d", *args])


def _validate(cfg):
    cls = strategy_class("3d")
    derive_and_validate(cfg, world.world_size_for(cfg, cls), cls)


@pytest.mark.parametrize("case", IN_PROCESS_CASES)
def test_invalid_layout_rejected_by_validate(composer, case):
    args, key, fragment = IN_PROCESS_CASES[case]
    with pytest.raises(ConfigError) as e:
        _validate(composer(*args))
    assert e.value.key == key
    assert fragment in str(e.value)


def test_defaults_are_valid_and_spawn_eight_workers(composer):
    cfg = composer("trainer.global_batch_size=16", "trainer.micro_batch_size=16", "data.seq_len=128", "model=small")
    cls = strategy_class("3d")
    assert world.world_size_for(cfg, cls) == 8
    _validate(cfg)
    # the GPU-node form: tp 8 x pp 4 under a 32-process torchrun leaves dp_shard = 1
    gpu = composer("parallel.tp=8", "parallel.pp=4", "model.n_heads=8", "model.n_kv_heads=8", "model.dim=256",
                   "model.n_layers=8", "trainer.global_batch_size=32")
    assert ParallelDims.from_config(gpu.parallel, 32).dp_shard == 1
    derive_and_validate(gpu, 32, cls)


class Degrees:
    def __init__(self, **kw):
        self.__dict__.update(dict(dp_replicate=1, dp_shard=1, tp=1, pp=1) | kw)


def test_rest_of_world_and_rest_world_size():
    dims = ParallelDims.from_config(Degrees(tp=8, pp=4, dp_shard=-1), 64)
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp) == (4, 1, 2, 8)
    assert ParallelDims.degrees_product(Degrees(tp=2, pp=2, dp_shard=2)) == 8
    with pytest.raises(ConfigError, match="= 16 processes, but the world size is 8"):
        ParallelDims.from_config(Degrees(tp=2, pp=2, dp_shard=2, dp_replicate=2), 8)


def test_the_schedule_rules_kept_by_name_are_torchs():
    """Validation reads the schedules' shapes from names (no torch.distributed.pipelining before a worker
    starts); they must be what torch's classes say, for every schedule we accept."""
    from torch.distributed.pipelining.schedules import (PipelineScheduleSingle, ScheduleDualPipeV,
                                                        ScheduleZBVZeroBubble, get_schedule_class)

    from framework.parallel.pipeline import SCHEDULES, SINGLE_STAGE, V_SHAPED, schedule_class
    for name in SCHEDULES:
        cls = get_schedule_class(name)
        assert schedule_class(name.upper()) is cls
        assert (name in SINGLE_STAGE) == issubclass(cls, PipelineScheduleSingle), name
        assert (name in V_SHAPED) == issubclass(cls, (ScheduleZBVZeroBubble, ScheduleDualPipeV)), name


def test_the_stage_marks_the_forward_torch_runs_for_shapes():
    """Our stages mark torch's shape-inference forward (models count no statistics of it) by overriding the
    private method torch runs it in, which must exist (that it runs is shown by test_moe_layouts: the
    pipelined MoE's first step counts the experts' loads of single's)."""
    from torch.distributed.pipelining import PipelineStage

    from framework.parallel.pipeline import _stage_class
    assert callable(getattr(PipelineStage, "_forward_metadata_inference", None))
    assert _stage_class()._forward_metadata_inference is not PipelineStage._forward_metadata_inference
