"""Bad invocations stop before any work: exit 2, one line naming the key, no traceback, nothing written."""
import atexit
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from framework.errors import ConfigError
from framework.launch import admission
from tests.harness.helpers import validate_composed, run_framework

# Data files for the bad-input cases: an empty corpus and one of 100 bytes (byte-level: 100 tokens).
_DATA = Path(tempfile.mkdtemp(prefix="fw-validation-"))
atexit.register(shutil.rmtree, _DATA, True)
EMPTY, SHORT = _DATA / "empty.txt", _DATA / "short.txt"
EMPTY.write_bytes(b"")
SHORT.write_bytes(b"x" * 100)


def case_id(args):
    """The case's overrides, with the data folder named alike in every process (pytest-xdist's workers
    must collect the same ids)."""
    return " ".join(args).replace(str(_DATA), "DATA")

# (overrides, text the first error line must contain)
CASES = [
    (["trainer.profile.steps=[3,2]"], "trainer.profile.steps"),
    (["model=gpt2_tiny", "parallel=3d", "parallel.tp=2", "parallel.sequence_parallel=true"], "position embeddings"),
    (["parallel=ddp", "zero=stage3"], "zero: parallel=ddp does not do zero=stage3; parameter sharding is done by parallel=fsdp"),
    (["parallel=ddp", "zero=stage2"], "zero: parallel=ddp does not do zero=stage2"),
    (["zero=stage1"], "zero: parallel=single does not do zero=stage1"),
    (["trainer.global_batch_size=10", "trainer.micro_batch_size=4"], "trainer.global_batch_size: 10 is not divisible"),
    (["parallel=ddp", "launcher.nproc_per_node=3", "trainer.global_batch_size=16", "trainer.micro_batch_size=4"],
     "trainer.global_batch_size: 16 sequences do not divide among 3 data-parallel ranks; use a multiple of 3"),
    (["parallel=ddp", "launcher.nproc_per_node=2", "trainer.global_batch_size=12", "trainer.micro_batch_size=4"],
     "micro_batch_size x data-parallel degree = 4 x 2 = 8"),
    (["data.seq_len=1000"], "data.seq_len: 1000 exceeds model.max_seq_len=512"),
    (["optimizer.lr=-1"], "optimizer.lr: must be positive"),
    (["trainer.max_steps=0"], "trainer.max_steps: must be positive"),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size: must be positive"),
    (["data=text", "data.path=/nonexistent/corpus.txt"], "data.path: no such file: /nonexistent/corpus.txt"),
    (["data=tokens"], "data.path: is required"),
    (["model.n_kv_heads=3"], "model.n_kv_heads: 3 must divide model.n_heads=4"),
    (["model.dim=130"], "model.dim: 130 is not divisible by model.n_heads=4"),
    (["model.vocab_size=100"], "model.vocab_size: 100 is smaller than the data's vocabulary"),
    (["parallel=single", "launcher.nproc_per_node=2"], "launcher.nproc_per_node: parallel=single runs one process"),
    (["parallel.tp=2"], "parallel.tp: parallel=single has no tp dimension"),
    (["parallel=ddp", "parallel.comm_hook=int3"], "parallel.comm_hook: unknown hook"),
    (["parallel=ddp", "parallel.static_graph=true", "trainer.micro_batch_size=2"], "parallel.static_graph"),
    (["parallel=ddp", "zero.offload_optimizer=true"], "zero: parallel=ddp cannot offload"),
    (["scheduler.min_lr_ratio=2"], "scheduler.min_lr_ratio: must be in [0, 1]"),
    (["optimizer._target_=torch.optim.NoSuchOpt"], "optimizer._target_: cannot import"),
    (["model=custom", "model._target_=no.such.Module"], "model._target_: cannot import"),
    (["device=tpu"], "device: 'tpu' is not one of auto|cpu|cuda"),
    (["launcher.max_restarts=-1"], "launcher.max_restarts: must not be negative"),
    (["launcher.timeout_s=0"], "launcher.timeout_s: must be positive"),
    (["trainer.stall_timeout_s=-5"], "trainer.stall_timeout_s: must not be negative"),
    (["+trainer.max_step=10"], "trainer.max_step: no such key; did you mean trainer.max_steps?"),
    (["+trainer.foo=1"], "trainer.foo: no such key; trainer has max_steps"),
    (["+optimizer.betas2=1"], "optimizer.betas2: no such key; did you mean optimizer.betas?"),
    (["+seeed=1"], "seeed: no such key; did you mean seed?"),
    (["data=text", f"data.path={EMPTY}"], f"data.path: {EMPTY} is empty"),
    (["data=text", f"data.path={SHORT}", "trainer.eval_every=0"],
     f"data.path: {SHORT} is too short: it holds 100 tokens, one training sequence needs 129, so at least 135"),
    (["data=text", f"data.path={SHORT}", "data.seq_len=16"],
     "one training sequence needs 17 plus a validation split (data.val_fraction=0.05) of as many, so at least 340"),
]

# Rejected by Hydra while composing (typed schemas), before our code runs.
COMPOSE_CASES = [
    (["trainer.max_stepz=3"], "trainer.max_stepz"),
    (["trainer.max_steps=abc"], "trainer.max_steps"),
    (["model.hidden=3"], "model.hidden"),
    (["parallel=nope"], "parallel/nope"),
    (["optimizer.momentum=0.9"], "optimizer.momentum"),   # AdamW has no momentum
]


@pytest.fixture(scope="module")
def composer(compose_config):
    return compose_config


@pytest.mark.parametrize("args,expected", CASES, ids=[case_id(a) for a, _ in CASES])
def test_validation_names_the_key(composer, args, expected):
    with pytest.raises(ConfigError) as err:
        validate_composed(composer(args))
    assert expected in f"{err.value}"


@pytest.mark.parametrize("args,expected", COMPOSE_CASES, ids=[" ".join(a) for a, _ in COMPOSE_CASES])
def test_schema_rejects_at_compose_time(composer, args, expected):
    with pytest.raises((HydraException, OmegaConfBaseException)) as err:
        composer(args)
    assert expected in str(err.value)


def test_default_and_shipped_sizesvalidate_composed(composer):
    validate_composed(composer([]))
    for model in ("tiny", "small", "llama_125m"):
        validate_composed(composer([f"model={model}"]))


@pytest.mark.parametrize("model", ["llama3_8b", "llama3_70b", "llama3_405b"])
def test_big_model_sizes_compose_and_validate_without_instantiating(composer, model):
    cfg = composer([f"model={model}", "data=synthetic", "data.vocab_size=128256", "data.seq_len=64",
                    "data.num_tokens=100000"])
    validate_composed(cfg)


def _check_rejected(tmp_path, args, expected, first_line_is_ours):
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_framework(args, run_dir, timeout=60)
    assert time.monotonic() - start < 60
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if first_line_is_ours:
        assert lines == [f"error: {lines[0][len('error: '):]}"], proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir()), "a rejected job left files behind"


END_TO_END = [CASES[0], CASES[4], CASES[9], CASES[11], CASES[14], *CASES[24:]]


@pytest.mark.parametrize("args,expected", END_TO_END, ids=[case_id(a) for a, _ in END_TO_END])
def test_invalid_config_exits_2_with_one_line(tmp_path, args, expected):
    _check_rejected(tmp_path, args, expected, first_line_is_ours=True)


@pytest.mark.parametrize("args,expected", COMPOSE_CASES[:2], ids=[" ".join(a) for a, _ in COMPOSE_CASES[:2]])
def test_compose_errors_exit_2_without_traceback(tmp_path, args, expected):
    _check_rejected(tmp_path, args, expected, first_line_is_ours=False)


# recipe -> the world size it is written for (torchrun's WORLD_SIZE on GPU nodes)
RECIPES = {"cpu_small_ddp": None, "llama_125m": None, "llama_125m_muon": None, "llama3_8b": 8, "llama3_70b": 32,
           "llama3_405b": 224}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_compose_and_validate_at_their_world_size(composer, monkeypatch, recipe):
    overrides = [f"+recipe={recipe}"]
    if recipe != "cpu_small_ddp":   # GPU recipes read a token file; stand in synthetic tokens here
        overrides += ["data=synthetic", "data.num_tokens=2000000", "data.val_fraction=0.5"]
        if not recipe.startswith("llama_125m"):
            overrides += ["data.vocab_size=128256", "data.seq_len=1024"]
    if RECIPES[recipe]:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(RECIPES[recipe]))
    cfg = composer(overrides)
    assert cfg.model.n_layers > 0
    validate_composed(cfg)


@pytest.mark.parametrize("args,micro", [([], 16), (["parallel=ddp"], 8), (["parallel=fsdp", "zero=stage3"], 8),
                                        (["parallel=deepspeed", "zero=stage2"], 8), (["parallel=3d"], 8),
                                        (["parallel=ddp", "trainer.micro_batch_size=4"], 4)])
def test_unset_micro_batch_size_is_a_ranks_share(composer, args, micro):
    cfg = composer(args)
    validate_composed(cfg)
    assert cfg.trainer.micro_batch_size == micro


def test_unset_micro_batch_size_needs_a_global_batch_that_divides(composer):
    with pytest.raises(ConfigError, match="trainer.global_batch_size: 15 sequences do not divide among 2"):
        validate_composed(composer(["parallel=ddp", "trainer.global_batch_size=15"]))


def test_keys_of_a_users_own_class_stay_free(composer):
    cfg = composer(["model=custom", "model._target_=tests.fixtures.models.NaNAtStep", "+model.nan_at_forward=5",
                    "optimizer._target_=torch.optim.Adam", "+optimizer.amsgrad=true"])
    validate_composed(cfg)
    assert cfg.model.nan_at_forward == 5 and cfg.optimizer.amsgrad is True
