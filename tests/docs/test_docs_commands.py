"""Every command README.md and docs/ show is run by a test, as written (tests/harness/docs_commands.py says which),
in the environment README's set-up builds plus the extras its page says to install, and the `python -m
framework ...` training commands no other test claims run here: from a directory other than the checkout,
shortened to 2 steps, each ending with a finite loss and validation loss (the mission's `parallel=3d
zero=stage3` included: 8 workers, tp 2 x pp 2 x dp_shard 2). Slow-ish: several are multi-process."""
import json
import math
import os
import shlex
import subprocess
import sys

import pytest

from tests.harness import docs_commands, readme_env
from tests.harness.helpers import REPO, run_framework

#: minutes of runs: pytest-xdist starts this module first (tests/conftest.py)
RUNS_LONGEST = True

SHORTEN = ["trainer.max_steps=2", "trainer.eval_batches=1", "trainer.progress_bar=false"]
COMMANDS = docs_commands.run_by(docs_commands.GENERIC)


def test_every_command_the_docs_show_is_run_by_a_test_or_says_what_it_needs():
    uncovered = [f"{c.page}: {c}" for c in docs_commands.commands() if docs_commands.owner(c) is None]
    assert not uncovered, ("no test runs these; give them a marker in tests/harness/docs_commands.py RUN_BY (and run "
                           "them there) or NEEDS:\n" + "\n".join(uncovered))
    for _, test in docs_commands.RUN_BY:
        assert "run_by(" in (REPO / test).read_text(), f"{test} is named in RUN_BY but never asks run_by() for its commands"


def test_the_docs_show_the_examples_this_module_runs():
    texts = [c.text for c in COMMANDS]
    assert len(texts) >= 10 and "python -m framework" in texts and "python -m framework parallel=3d zero=stage3" in texts


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.text[len("python -m framework "):][:60] or "default")
def test_docs_command_runs(tmp_path, command):
    args = shlex.split(command.text)[3:]
    # as a user runs it: the installed package, from a directory of their own
    proc = run_framework([*args, *SHORTEN], cwd=tmp_path, timeout=1200, env=docs_commands.environment(command))
    assert proc.returncode == 0, f"{command.page}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    runs = list((tmp_path / "outputs").rglob("metrics.jsonl"))
    assert runs, "no run dir under the working directory"
    for metrics in runs:
        last = json.loads(metrics.read_text().splitlines()[-1])
        # the default evaluates at the last step: through the pipeline too, for parallel=3d
        assert last["step"] == 2 and math.isfinite(last["loss"]) and math.isfinite(last["val_loss"]), (command, last)


def test_every_test_that_runs_docs_commands_runs_them_in_readmes_environment():
    tests = {test for _, test in docs_commands.RUN_BY} | set(docs_commands.PAGES.values()) | {docs_commands.GENERIC}
    uses = {t: any(call in (REPO / t).read_text() for call in ("environment(", "run_as_written(")) for t in tests}
    assert not [t for t in sorted(tests) if not uses[t] and t not in docs_commands.README_ENV_NOT_YET], \
        "run the commands with tests.harness.docs_commands.run_as_written(command) or environment(command), or say " \
        "why not in README_ENV_NOT_YET"
    assert not [t for t in docs_commands.README_ENV_NOT_YET if uses.get(t, True)], "moved over: drop it from the list"


#: modules README's set-up does not install (each of an extra), and ones it does
HIDDEN = {"transformers": "hf", "pyarrow": "parquet", "torchao": "float8", "matplotlib": "plots",
          "hydra_plugins.hydra_joblib_launcher": "sweep", "s3fs": "s3", "datasets": "datasets", "google.auth": None}
KEPT = ("torch", "hydra", "omegaconf", "deepspeed", "tokenizers", "yaml", "google.protobuf", "framework", "pip")
PROBE = """
import importlib.metadata, importlib.util, json, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
def dist(name):
    try:
        return importlib.metadata.version(name) is not None
    except importlib.metadata.PackageNotFoundError:
        return False
try:
    import transformers
    imported = True
except ImportError:
    imported = False
try:
    import pkgutil, hydra_plugins
    plugins = sorted(m.name for m in pkgutil.iter_modules(hydra_plugins.__path__, "hydra_plugins."))
except ImportError:
    plugins = []
print(json.dumps({"found": {m: found(m) for m in sys.argv[1:]}, "dist": dist("transformers"), "imported": imported,
                  "plugins": plugins}))
"""


@pytest.mark.parametrize("extras", [(), ("hf",), ("slurm",)], ids=["readme", "readme+hf", "readme+slurm"])
def test_readmes_environment_hides_what_readmes_set_up_does_not_install(extras):
    proc = subprocess.run([sys.executable, "-c", PROBE, *HIDDEN, *KEPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **readme_env.environment(extras)})
    got = json.loads(proc.stdout)
    assert got["found"] == {**{m: extra in extras for m, extra in HIDDEN.items()}, **{m: True for m in KEPT}}
    assert got["dist"] == got["imported"] == ("hf" in extras)
    # Hydra lists the plugins of its namespace package, past sys.meta_path: only the slurm extra's is there
    assert got["plugins"] == (["hydra_plugins.hydra_submitit_launcher"] if "slurm" in extras else [])


def test_readmes_install_is_the_frameworks_own_requirements_and_their_closure():
    from importlib.metadata import requires
    from packaging.requirements import Requirement
    own = {readme_env.canonical(Requirement(r).name) for r in requires("framework") if "extra ==" not in r}
    base = readme_env.closure()
    assert own <= base and not {"transformers", "pyarrow", "torchao", "pytest"} & base
    assert readme_env.closure(frozenset({"hf"})) - base >= {"transformers"}
