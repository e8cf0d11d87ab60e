"""The batch rule in one function: a global batch over dp ranks (and a pipeline), or one ConfigError naming
the key. Pure arithmetic on a config: no process group, no composition."""
import pytest
from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.parallel.batch_layout import batch_layout, micro_batch_for


def cfg(total=16, micro=None, pp_microbatches=None, schedule="1F1B", virtual=1):
    return OmegaConf.create({"trainer": {"global_batch_size": total, "micro_batch_size": micro},
                             "parallel": {"pp_microbatches": pp_microbatches, "pp_schedule": schedule,
                                          "pp_virtual_stages": virtual}})


@pytest.mark.parametrize("config,dp,pp,micro,per_rank,forward,accumulation,pipeline", [
    (cfg(16), 1, 1, 16, 16, 16, 1, 1),                    # unset micro: the whole share in one forward
    (cfg(16), 4, 1, 4, 4, 4, 1, 1),
    (cfg(16, micro=2), 2, 1, 2, 8, 2, 4, 1),              # accumulation = global / (micro x dp)
    (cfg(16, micro=2), 2, 2, 2, 8, 2, 4, 4),              # pipeline: share / micro micro-batches
    (cfg(16, micro=8), 2, 4, 8, 8, 2, 4, 4),              # ... but at least the schedule's pp
    (cfg(16, micro=32), 2, 2, 32, 8, 4, 2, 2),            # a pipeline's micro batch only sets the default count
    (cfg(16, micro=2, pp_microbatches=2), 2, 2, 2, 8, 4, 2, 2),
    (cfg(16, micro=4, schedule="GPipe"), 1, 2, 4, 16, 4, 4, 4),
])
def test_layout(config, dp, pp, micro, per_rank, forward, accumulation, pipeline):
    got = batch_layout(config, dp, pp)
    assert (got.global_batch, got.dp, got.pp) == (config.trainer.global_batch_size, dp, pp)
    assert (got.micro_batch, got.per_rank, got.forward_batch, got.accumulation, got.pipeline_microbatches) == \
        (micro, per_rank, forward, accumulation, pipeline)
    assert got.forward_batch * got.accumulation * got.dp == got.global_batch


@pytest.mark.parametrize("config,dp,pp,key,message", [
    (cfg(0), 1, 1, "trainer.global_batch_size", "must be positive, got 0"),
    (cfg(8, micro=0), 1, 1, "trainer.micro_batch_size", "must be positive, got 0"),
    (cfg(15), 2, 1, "trainer.global_batch_size", "15 sequences do not divide among 2 data-parallel ranks; "
                                                  "use a multiple of 2"),
    (cfg(16, micro=4), 3, 1, "trainer.global_batch_size", "16 sequences do not divide among 3"),
    (cfg(12, micro=4), 2, 1, "trainer.global_batch_size", "12 is not divisible by micro_batch_size x "
                                                          "data-parallel degree = 4 x 2 = 8"),
    (cfg(16, micro=16), 2, 1, "trainer.micro_batch_size", "16 exceeds a data-parallel rank's share of 8 "
                                                          "sequences (16 / dp 2); use at most 8"),
    (cfg(16, pp_microbatches=0), 2, 2, "parallel.pp_microbatches", "must be positive, got 0"),
    (cfg(16, pp_microbatches=3), 2, 2, "parallel.pp_microbatches", "a data-parallel rank's 8 sequences (16 / dp 2) "
                                                                   "do not split into 3 equal pipeline micro-batches"),
    (cfg(16, schedule="Wavefront"), 2, 2, "parallel.pp_schedule", "unknown schedule 'Wavefront'"),
])
def test_refusal_names_the_key(config, dp, pp, key, message):
    with pytest.raises(ConfigError) as err:
        batch_layout(config, dp, pp)
    assert err.value.key == key and message in str(err.value)


def test_micro_batch_for_an_accumulation():
    assert micro_batch_for(16, 2, 4) == 2
    assert [micro_batch_for(16, 2, n) for n in (3, 0, -2)] == [None, None, None]
