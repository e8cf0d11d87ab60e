"""Every option that needs an extra of pyproject.toml, asked for in README's environment (no extra installed:
tests/harness/readme_env.py): one line naming the key that needs it and the extra that installs it, exit 2, in the
launching process before any work (no run dir, no prepared dataset). The chat recipes and model=hf:
tests/integration/models/test_hf_extra.py; precision=float8 and the trackers: their own checks, held here too."""
import pytest

from tests.harness import readme_env
from tests.harness.helpers import run_framework

#: (case, overrides, the one line); {tmp} is the test's folder
CASES = [
    ("parquet", ["data=parquet", "data.path={tmp}/docs.parquet", "data.tokenizer=bytes"],
     "error: data.source: Parquet files are read by pyarrow, which is not installed: pip install 'framework[parquet]'"),
    ("chat-parquet", ["data=chat", "data.path={tmp}/chats.parquet", "data.tokenizer=bytes"],
     "error: data.path: {tmp}/chats.parquet: Parquet files are read by pyarrow, which is not installed: "
     "pip install 'framework[parquet]'"),
    ("datasets", ["data=datasets", "data.path={tmp}", "data.tokenizer=bytes"],
     "error: data.source: Hugging Face datasets are loaded by the package datasets, which is not installed: "
     "pip install 'framework[datasets]'"),
    ("qlora", ["lora.enabled=true", "lora.base_dtype=nf4"],
     "error: lora.base_dtype: lora.base_dtype=nf4 weights are made by torchao, which is not installed: "
     "pip install 'framework[qlora]'"),
    ("float8", ["precision=float8", "precision.float8_emulate=true"],
     "error: precision: precision=float8 needs torchao: pip install 'framework[float8]'"),
    ("wandb", ["logging.trackers=[wandb]"],
     "error: logging.trackers: wandb needs its client library: pip install 'framework[wandb]'"),
    ("s3", ["checkpoint.dir=s3://bucket/runs"],
     "error: checkpoint.dir: s3://bucket/runs: s3:// needs s3fs, which is not installed: pip install 'framework[s3]'"),
    ("joblib", ["-m", "hydra/launcher=joblib", "seed=0,1"],
     "error: hydra/launcher: hydra/launcher=joblib is run by hydra-joblib-launcher, which is not installed: "
     "pip install 'framework[sweep]'"),
    ("submitit", ["-m", "hydra/launcher=local", "seed=0,1"],
     "error: hydra/launcher: hydra/launcher=local is run by hydra-submitit-launcher, which is not installed: "
     "pip install 'framework[slurm]'"),
    ("optuna", ["-m", "hydra/sweeper=optuna"],
     "error: hydra/sweeper: hydra/sweeper=optuna is run by hydra-optuna-sweeper, which is not installed: "
     "pip install 'framework[sweep]'"),
]


@pytest.mark.parametrize("args,line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_option_whose_extra_readme_does_not_install_is_one_line_naming_it(tmp_path, args, line):
    (tmp_path / "docs.parquet").write_bytes(b"PAR1")
    (tmp_path / "chats.parquet").write_bytes(b"PAR1")
    env = {**readme_env.environment(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = run_framework(["model=tiny", "trainer.max_steps=1", "hydra.sweep.dir=sweep",
                          *(a.format(tmp=tmp_path) for a in args)], tmp_path / "run", env=env, cwd=tmp_path,
                         timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [line.format(tmp=tmp_path)], proc.stderr[-3000:]
    assert not {"run", "cache", "sweep", "outputs"} & {p.name for p in tmp_path.iterdir()}
