"""trainer.rampup_batch_size, as Megatron's --rampup-batch-size: the global batch of each step, the sequences it
takes (right after the earlier steps'), the losses against a loop written here over the same batches, and a
resume across a ramp step."""
import pytest
import torch
from omegaconf import OmegaConf

from framework.data.batches import GlobalBatchSampler, split_train_val
from framework.data.ramp import BatchSizes
from framework.data.sources import streams
from framework.errors import ConfigError
from framework.models.factory import ModelFactory
from framework.models.loss import cross_entropy, weighted_micro_batch
from framework.optim.factory import OptimizerFactory
from framework.optim.schedulers import build_scheduler
from tests.harness.helpers import validate_composed, FAST, check_ok, losses, max_rel_diff, read_metrics, run_framework

RAMP = [2, 2, 16]           # FAST's global batch is 8 and its micro-batch 2
RAMPED = [*FAST, f"trainer.rampup_batch_size=[{','.join(map(str, RAMP))}]", "parallel=single"]


def megatron_size(consumed: int, start: int, increment: int, samples: int, final: int) -> int:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator.update, as it is written there."""
    if consumed > samples:
        return final
    per_increment = samples / ((final - start) // increment)
    return start + int(consumed / per_increment) * increment


def megatron_sizes(steps: int, ramp, final: int) -> list[int]:
    sizes, consumed = [], 0
    for _ in range(steps):
        sizes.append(megatron_size(consumed, *ramp, final))
        consumed += sizes[-1]
    return sizes


@pytest.mark.parametrize("final,ramp", [(8, RAMP), (1024, [32, 32, 20_000]), (96, [16, 8, 1000]), (64, [48, 16, 1])])
def test_sizes_and_offsets_are_megatrons(final, ramp):
    sizes = megatron_sizes(400, ramp, final)
    ours = BatchSizes(final, ramp)
    assert [ours.size(k) for k in range(400)] == sizes
    assert [ours.offset(k) for k in range(401)] == [sum(sizes[:k]) for k in range(401)]


def reference_losses(cfg, steps: int) -> list[float]:
    """A plain loop over the ramp's batches: step k takes the sequences after the earlier steps' ones."""
    t = cfg.trainer
    model = ModelFactory(cfg)()
    optimizer = OptimizerFactory(cfg.optimizer)(model.parameters())
    scheduler = build_scheduler(optimizer, cfg.scheduler, t.max_steps)
    train, _ = split_train_val(streams(cfg.data)[0].tokens, cfg.data.val_fraction)
    order = GlobalBatchSampler(train, cfg.data.seq_len, t.global_batch_size, cfg.seed)   # its shuffled order only
    out, consumed = [], 0
    for size in megatron_sizes(steps, list(t.rampup_batch_size), t.global_batch_size):
        batch = order.sequences(order.ids_at(range(consumed, consumed + size)))
        consumed += size
        chunks = batch.split(t.micro_batch_size)
        total = 0.0
        for chunk in chunks:
            with weighted_micro_batch(1 / len(chunks)):
                loss = cross_entropy(model(chunk[:, :-1]), chunk[:, 1:])
                (loss / len(chunks)).backward()
            total += float(loss.detach())
        out.append(total / len(chunks))
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return out


@pytest.fixture(scope="module")
def ramped(tmp_path_factory):
    """An uninterrupted ramped run, with a checkpoint after step 3: the last step of 2 sequences."""
    run_dir = tmp_path_factory.mktemp("ramped") / "run"
    check_ok(run_framework([*RAMPED, "checkpoint.enabled=true", "checkpoint.interval=3", "checkpoint.keep_last=3"],
                           run_dir))
    return run_dir


def test_a_ramped_run_trains_the_batches_of_a_plain_loop(ramped):
    records = read_metrics(ramped)
    cfg = OmegaConf.load(ramped / "config.yaml")
    assert [r["global_batch_size"] for r in records] == megatron_sizes(8, RAMP, 8) == [2, 2, 2, 4, 4, 6, 8, 8]
    # tokens/s counts the step's own batch (each record covers one step here)
    for r in records:
        assert abs(r["tokens_per_sec"] * r["step_time"] - r["global_batch_size"] * cfg.data.seq_len) < 1e-6
    assert max_rel_diff([r["loss"] for r in records], reference_losses(cfg, len(records))) < 1e-5


def test_resume_across_a_ramp_step_is_exact(ramped, tmp_path):
    """Resumed after step 3, step 4 takes 4 sequences, from the 7th on, as in the uninterrupted run."""
    run_dir = tmp_path / "run"
    check_ok(run_framework([*RAMPED, f"checkpoint.resume={ramped / 'checkpoints' / 'step_00000003'}"], run_dir))
    resumed = read_metrics(run_dir)
    assert [r["step"] for r in resumed] == [4, 5, 6, 7, 8]
    assert [r["global_batch_size"] for r in resumed] == [4, 4, 6, 8, 8]
    assert [r["loss"] for r in resumed] == losses(ramped)[3:]


@pytest.fixture(scope="module")
def composer(compose_config):
    return compose_config


REFUSED = [
    (["trainer.rampup_batch_size=[4,4]"], "trainer.rampup_batch_size: give [start, increment, samples]"),
    (["trainer.rampup_batch_size=[8,4,16]"], "trainer.rampup_batch_size: starts at 8 sequences, not below "
                                             "trainer.global_batch_size=8"),
    (["trainer.rampup_batch_size=[2,4,16]"], "steps of 4 from 2 do not reach trainer.global_batch_size=8"),
    (["parallel=ddp", "launcher.nproc_per_node=2", "trainer.rampup_batch_size=[2,2,16]"],
     "trainer.rampup_batch_size: a ramp step of 2 sequences does not split into forward passes of 2 on 2 "
     "data-parallel ranks; make start and increment multiples of 4, or lower trainer.micro_batch_size"),
    (["parallel=deepspeed", "launcher.nproc_per_node=2", "trainer.rampup_batch_size=[4,4,16]"],
     "trainer.rampup_batch_size: parallel=deepspeed cannot change a step's micro-batches mid-run"),
    (["parallel=deepspeed", "launcher.nproc_per_node=2", "trainer.on_oom=retry"],
     "trainer.on_oom: parallel=deepspeed cannot change a step's micro-batches mid-run"),
    (["parallel=ddp", "launcher.nproc_per_node=2", "trainer.micro_batch_size=4", "parallel.static_graph=true",
      "trainer.on_oom=retry"], "trainer.on_oom: retry may halve the micro-batch to 2, where parallel.static_graph"),
]


@pytest.mark.parametrize("args,expected", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_what_cannot_change_its_batch_is_refused_naming_both_keys(composer, args, expected):
    with pytest.raises(ConfigError) as err:
        validate_composed(composer([*FAST, *args]))
    assert expected in str(err.value)


def test_a_pipeline_may_ramp_and_retry(composer):
    validate_composed(composer([*FAST, "parallel=3d", "parallel.tp=1", "parallel.pp=2", "launcher.nproc_per_node=2",
                        "trainer.rampup_batch_size=[4,2,16]", "trainer.on_oom=retry"]))
