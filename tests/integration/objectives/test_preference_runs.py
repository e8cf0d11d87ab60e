"""DPO jobs end to end on the pairs the package ships: a resume from step 2 replays steps 3 and 4 exactly (the
reference is built again from the initial weights, never read from the checkpoint), losses and TRL's reward
metrics included; fsdp x2 (the reference sharded as the policy) gives single's; and the reference's memory, as
planned and as measured: a frozen copy costs a model's parameters (reference_bytes, and the peak resident set
against SimPO's, which has no reference, on a model large enough to see it), LoRA's base with the adapters off
costs nothing of the kind. ORPO on fsdp x2, one pair a micro-batch, gives single's in two pairs a micro-batch, its
NLL (a mean over the global batch's chosen tokens) and TRL's metrics included. Layouts and options crossed with each
objective are the combination matrix's (tests/matrix: objective=dpo and simpo with every strategy, LoRA, precision,
checkpointing).

objective.precompute_reference=true: the single and fsdp jobs again with the reference's log-probs scored before
training give the live reference's numbers bit for bit (the pass runs the training micro-batches of the first
epoch); the single one's checkpoints are in a bucket (moto's S3 server) with the table in each, a resume from its
step 2 reads the table back instead of scoring again, a table for other data or a damaged one is refused in one
line, and no reference is planned or held."""
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load

from framework import storage
from framework.data.assets import path as asset_path
from framework.objectives.orpo import ORPO
from framework.objectives.preference import REWARD_METRICS
from framework.train.reference_table import TABLE
from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework
from tests.harness.parity import assert_series_parity
from tests.harness.servers import make_bucket

STEPS = 4


def _pairs(root):
    return ["data=preference", f"data.path={asset_path('tiny_prefs.jsonl')}", "data.tokenizer=bytes",
            "data.chat_template=chatml", "data.seq_len=64", f"data.cache_dir={root / 'cache'}",
            "trainer.global_batch_size=4", "trainer.micro_batch_size=1", f"trainer.max_steps={STEPS}",
            "trainer.eval_every=2", "trainer.eval_batches=1"]


#: a model whose frozen copy (~50 MB) stands out of a CPU process's resident-set noise (a few MB)
WIDE = ["model.dim=512", "model.n_layers=4", "model.n_heads=8", "model.n_kv_heads=8", "trainer.max_steps=2",
        "trainer.global_batch_size=2"]
LORA = ["lora.enabled=true", "lora.rank=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    base = [*FAST, *_pairs(root), "objective=dpo"]
    out = {name: root / name for name in ("single", "resumed", "fsdp", "dpo", "simpo", "lora_dpo", "lora_simpo")}
    check_ok(run_framework([*base, "checkpoint.enabled=true", "checkpoint.interval=2"], out["single"]))
    check_ok(run_framework([*base, "checkpoint.enabled=true", "checkpoint.interval=2",
                            f"checkpoint.resume={out['single'] / 'checkpoints' / 'step_00000002'}"], out["resumed"]))
    check_ok(run_framework([*base, "parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2"], out["fsdp"]))
    for name, objective, lora in (("dpo", "dpo", []), ("simpo", "simpo", []), ("lora_dpo", "dpo", LORA),
                                  ("lora_simpo", "simpo", LORA)):
        check_ok(run_framework([*FAST, *_pairs(root), *WIDE, f"objective={objective}", *lora], out[name]))
    return out


def _series(run_dir, key, steps=None):
    return [r[key] for r in read_metrics(run_dir) if key in r and (steps is None or r["step"] in steps)]


def test_a_resume_replays_the_losses_and_rewards_exactly(runs):
    resumed = read_metrics(runs["resumed"])
    assert [r["step"] for r in resumed] == [3, 4]
    for key in ("loss", "grad_norm", *REWARD_METRICS):
        assert _series(runs["resumed"], key) == _series(runs["single"], key, {3, 4}), key
    assert _series(runs["single"], "rewards/margins")[-1] != 0


def test_fsdp_gives_singles_losses_and_rewards(runs):
    for key in ("loss", "grad_norm", "rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert_series_parity(key, _series(runs["fsdp"], key), _series(runs["single"], key), "fp32-distributed")
    # a reward is beta times a difference of two log-probs of ~100: its error is theirs (1e-5 of them), not its own
    scale = 0.1 * max(abs(v) for v in _series(runs["single"], "logps/chosen"))
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        for a, b in zip(_series(runs["fsdp"], key), _series(runs["single"], key)):
            assert abs(a - b) <= 1e-5 * scale, (key, a, b)


def _planned_reference(run_dir) -> int:
    from framework.plan.layout import layout_of
    from framework.plan.model_states import model_states
    from framework.plan.shapes import rank_parameters
    cfg = OmegaConf.load(run_dir / "config.yaml")
    layout = layout_of(cfg, read_metrics(run_dir)[-1]["world_size"])
    return model_states(cfg, layout, rank_parameters(cfg, layout, pp_rank=0)).reference


@pytest.mark.parametrize("name", ["single", "fsdp", "dpo"])
def test_a_frozen_reference_is_the_models_parameters_as_planned(runs, name):
    last = read_metrics(runs[name])[-1]
    assert last["reference_bytes"] == last["param_bytes"] == _planned_reference(runs[name])


def test_a_lora_reference_is_the_base_with_adapters_off_costing_no_copy(runs):
    copy = read_metrics(runs["dpo"])[-1]["reference_bytes"]
    assert copy > 40e6
    peak = {name: max(r["memory_gb"] for r in read_metrics(runs[name])) * 2**30
            for name in ("dpo", "simpo", "lora_dpo", "lora_simpo")}
    # the frozen copy shows in the peak, within the resident set's noise
    assert 0.7 * copy < peak["dpo"] - peak["simpo"] < 1.3 * copy, (peak, copy)
    # LoRA's reference is the same weights: no copy planned, none built, no copy's worth in the peak
    assert _planned_reference(runs["lora_dpo"]) == 0 and "reference_bytes" not in read_metrics(runs["lora_dpo"])[-1]
    assert peak["lora_dpo"] - peak["lora_simpo"] < 0.2 * copy, (peak, copy)
    assert read_metrics(runs["lora_dpo"])[-1]["rewards/margins"] != 0     # the adapters moved it off the base


@pytest.fixture(scope="module")
def orpo_runs(tmp_path_factory):
    """ORPO on one process in two micro-batches of two pairs, and on fsdp x2 in one pair a micro-batch: its NLL's
    mean over the global batch's chosen targets must not see the split (a micro-batch's own mean would)."""
    root = tmp_path_factory.mktemp("orpo")
    base = [*FAST, *_pairs(root), "objective=orpo"]
    out = {"single": root / "single", "fsdp": root / "fsdp"}
    check_ok(run_framework([*base, "trainer.micro_batch_size=2"], out["single"]))
    check_ok(run_framework([*base, "parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2"], out["fsdp"]))
    return out


def test_orpo_on_fsdp_gives_singles_losses_and_metrics(orpo_runs):
    single = read_metrics(orpo_runs["single"])
    assert set(ORPO.metric_names) <= set(single[-1]) and single[-1]["rewards/margins"] != 0
    for key in ("loss", "grad_norm", "nll_loss", "log_odds_ratio", "log_odds_chosen", "rewards/accuracies",
                "logps/chosen", "logps/rejected"):
        assert_series_parity(key, _series(orpo_runs["fsdp"], key), _series(orpo_runs["single"], key),
                             "fp32-distributed")
    # ORPO's rewards are beta times averaged log-probs (~1 here): plain relative parity holds for them
    for key in ("rewards/chosen", "rewards/rejected"):
        assert_series_parity(key, _series(orpo_runs["fsdp"], key), _series(orpo_runs["single"], key),
                             "fp32-distributed")


PRECOMPUTE = ["objective=dpo", "objective.precompute_reference=true"]
KEYS = ("loss", "grad_norm", "val_loss", *REWARD_METRICS)


@pytest.fixture(scope="module")
def precomputed(runs, s3_env):
    """`runs`' single job with the reference precomputed, its checkpoints in a bucket; resumed there from step 2
    (into checkpoints of its own); `runs`' fsdp job with the reference precomputed."""
    root = runs["single"].parent
    bucket = make_bucket(s3_env, "precomputed")
    out = {"single": root / "pre_single", "resumed": root / "pre_resumed", "fsdp": root / "pre_fsdp",
           "bucket": f"{bucket}/single", "resumed_bucket": f"{bucket}/resumed"}
    base = [*FAST, *_pairs(root), *PRECOMPUTE]
    out["single_proc"] = run_framework([*base, "checkpoint.enabled=true", "checkpoint.interval=2",
                                        f"checkpoint.dir={out['bucket']}"], out["single"], env=s3_env)
    check_ok(out["single_proc"])
    out["resumed_proc"] = run_framework([*base, "checkpoint.enabled=true", "checkpoint.interval=2",
                                         f"checkpoint.dir={out['resumed_bucket']}",
                                         f"checkpoint.resume={out['bucket']}/step_00000002"], out["resumed"], env=s3_env)
    check_ok(out["resumed_proc"])
    out["fsdp_proc"] = run_framework([*base, "parallel=fsdp", "zero=stage3", "launcher.nproc_per_node=2"], out["fsdp"])
    check_ok(out["fsdp_proc"])
    return out


@pytest.mark.parametrize("name", ["single", "fsdp"])
def test_a_precomputed_reference_gives_the_live_references_numbers(runs, precomputed, name):
    for key in KEYS:
        assert _series(precomputed[name], key) == _series(runs[name], key) != [], key
    said = [line for line in precomputed[f"{name}_proc"].stdout.splitlines() if line.startswith("objective.precompute_reference:")]
    assert len(said) == 1 and said[0].startswith("objective.precompute_reference: scored 251 train pairs and 5 val "
                                                 "pairs with the reference model"), said
    # no frozen copy held, none planned
    assert "reference_bytes" not in read_metrics(precomputed[name])[-1] and _planned_reference(precomputed[name]) == 0


def test_a_resume_reads_the_table_back_from_the_bucket(precomputed, s3_here):
    assert [r["step"] for r in read_metrics(precomputed["resumed"])] == [3, 4]
    for key in KEYS:
        assert _series(precomputed["resumed"], key) == _series(precomputed["single"], key, {3, 4}), key
    table = f"{precomputed['bucket']}/step_00000002/{TABLE}"
    said = [line for line in precomputed["resumed_proc"].stdout.splitlines() if line.startswith("objective.precompute_reference:")]
    # read, not scored again: the pass's one line says so
    assert len(said) == 1 and said[0].startswith(f"objective.precompute_reference: read the reference log-probs of "
                                                 f"251 train pairs and 5 val pairs from {table}"), said
    meta = storage.read_text(f"{precomputed['bucket']}/step_00000004/meta.json")
    assert TABLE in meta        # each checkpoint holds it, in its manifest
    # and the resumed run's own checkpoints hold the table it read
    kept, read = (load(storage.read_bytes(path)) for path in (f"{precomputed['resumed_bucket']}/step_00000004/{TABLE}",
                                                              table))
    assert kept.keys() == read.keys() == {"train", "val"} and all(torch.equal(kept[k], read[k]) for k in read)


def _bucket_state(prefix: str) -> dict[str, bytes]:
    import fsspec
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return {path: fs.cat_file(path) for path in fs.find(prefix.removeprefix("s3://"))}


def test_a_table_for_other_data_is_refused_in_one_line_leaving_the_bucket_as_it_was(precomputed, s3_here, tmp_path):
    before = _bucket_state(precomputed["bucket"])
    step = f"{precomputed['bucket']}/step_00000002"
    proc = run_framework([*FAST, *_pairs(precomputed["single"].parent), *PRECOMPUTE, "data.seq_len=48",
                          "checkpoint.enabled=true", f"checkpoint.resume={step}"], tmp_path / "run", env=s3_here)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: checkpoint.resume: refusing {step}/{TABLE}: it holds the reference log-probs of 251 train pairs, "
        f"the data has 231 now; start without checkpoint.resume (the pairs are scored again) or with the data it was "
        f"saved with"]
    assert _bucket_state(precomputed["bucket"]) == before


def test_a_damaged_table_is_refused_in_one_line(precomputed, s3_here, tmp_path):
    """A copy of step 2 on disk with one byte of the table's log-probs flipped (the bucket's is left as it was)."""
    import fsspec
    copy = tmp_path / "step_00000002"
    fsspec.filesystem("s3").get(f"{precomputed['bucket']}/step_00000002/", str(copy), recursive=True)
    data = bytearray((copy / TABLE).read_bytes())
    data[-3] ^= 0x40
    (copy / TABLE).write_bytes(bytes(data))
    proc = run_framework([*FAST, *_pairs(precomputed["single"].parent), *PRECOMPUTE, "checkpoint.enabled=true",
                          f"checkpoint.resume={copy}"], tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint.resume: refusing {copy}: {copy / TABLE} is "
                                                   f"damaged"), lines
