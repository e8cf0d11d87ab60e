"""The commands README.md and the docs site (docs/**/*.md) show, and which test runs each one as written.

A command is a line of a ```bash block that runs the framework (`-m framework`; continuation lines joined,
comments dropped). Every one of them is run by some test, or says here what it needs that CI lacks:

- RUN_BY: a command holding one of these markers is run by that test file, which asks `run_by(<its own
  path>)` for the commands it runs (so a page's new command with that marker is run without a test edit);
- NEEDS: a command holding one of these markers needs a GPU, a cluster or files of the user's;
- any other `python -m framework ...` training command is run by tests/docs/test_docs_commands.py (2 steps).

tests/docs/test_docs_commands.py fails on a command that none of these covers.

Commands run where README's set-up leaves a reader (`pip install -e .`: no extra) plus the extras their page
says to install before them, in a `pip install` line of a bash block (`pip install -e ".[hf]"`) up to the
command's own: `environment()` gives a job that environment (tests/harness/readme_env.py). A test that runs a page's
commands uses it, or says in README_ENV_NOT_YET why not.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.harness import readme_env
from tests.harness.helpers import REPO

GENERIC = "tests/docs/test_docs_commands.py"

#: marker -> the test that runs every command holding it (the first marker a command holds decides)
RUN_BY = [
    ("corpus", "tests/docs/test_docs_corpus.py"),                  # prepare -> train -> generate -> export, in order
    ("lr_sweep", "tests/integration/metrics/test_plots.py"),                      # a sweep, then compare's plot of it
    ("python -m framework.compare ", "tests/integration/metrics/test_plots.py"),
    ("--plot ", "tests/integration/metrics/test_plots.py"),
    ("python -m framework.plan ", "tests/integration/plan/test_plan.py"),
    ("python -m framework parallel=auto", "tests/integration/plan/test_plan.py"),
    ("python -m framework.k8s ", "tests/integration/k8s/test_k8s.py"),
    ("srun python -m framework ", "tests/integration/launch/test_slurm_sbatch.py"),
    ("--help", "tests/docs/test_config_reference.py"),
    ("--cfg job", "tests/docs/test_config_reference.py"),
    ("python -m framework.reference", "tests/docs/test_config_reference.py"),
    ("logging.trackers=", "tests/docs/test_howto_commands.py"),           # against the session's mlflow server
    ("trainer.on_oom=", "tests/docs/test_howto_commands.py"),
    ("trainer.rampup_batch_size=", "tests/docs/test_howto_commands.py"),
]

#: page -> the test file that runs every command on it, in page order (its commands build on each other)
PAGES = {
    "docs/concepts/checkpoints.md": "tests/integration/checkpoint/test_checkpoint_signing.py",
    "docs/how-to/evaluation.md": "tests/docs/test_docs_evaluation.py",
    "docs/how-to/fine-tuning.md": "tests/docs/test_docs_fine_tuning.py",
    "docs/how-to/moe.md": "tests/docs/test_how_to_moe.py",
    "docs/how-to/object-storage.md": "tests/docs/test_docs_object_storage.py",
    "docs/how-to/preference.md": "tests/docs/test_docs_preference.py",
    "docs/how-to/ray.md": "tests/docs/test_docs_ray.py",
}

#: marker -> what a command holding it needs that CI does not have
NEEDS = [
    ("python3 -m venv", "a fresh machine: .ci/run runs the test command, test_torch_requirement holds both to it"),
    ("torchrun ", "several nodes under torchrun"),
    ("hydra/launcher=slurm",
     "a SLURM cluster (tests/integration/launch/test_submitit.py runs the same sweep against a fake sbatch)"),
    ("data.path=/", "a corpus of the user's"),
    ("model.pretrained=/", "a model of the user's"),
    ("model._target_=my_pkg.", "a module of the user's"),
    ("checkpoint.initial_load=", "weights exported before"),
    ("outputs/run/", "a checkpoint of the user's"),
]


#: a bash-block line that installs extras: `pip install -e ".[hf,s3]"` or `pip install 'framework[s3]'`
SETUP = re.compile(r"^pip install\b.*?(?:framework|\.)\[([\w,-]+)\]")

#: test files that run their pages' commands in the test environment (every extra installed), each with why
README_ENV_NOT_YET: dict[str, str] = {}


@dataclass(frozen=True)
class Command:
    page: str       # relative to the repository
    block: int      # which ```bash block of the page, from 0
    text: str

    def __str__(self) -> str:
        return self.text


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def bash_blocks(path: Path) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def logical_lines(block: str) -> list[str]:
    """The block's lines with backslash continuations joined and comments dropped (a `#` that starts a
    word: the shebang and #SBATCH lines are comments too)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
        if line:
            out.append(" ".join(line.split()))
    return out


def commands() -> list[Command]:
    found = []
    for path in pages():
        for i, block in enumerate(bash_blocks(path)):
            found += [Command(str(path.relative_to(REPO)), i, line) for line in logical_lines(block)
                      if "-m framework" in line]
    return found


def owner(command: Command | str) -> str | None:
    """The test file that runs the command, `needs: <what>`, or None where nothing covers it."""
    text = str(command)
    if isinstance(command, Command) and command.page in PAGES:
        return PAGES[command.page]
    for marker, test in RUN_BY:
        if marker in text:
            return test
    for marker, need in NEEDS:
        if marker in text:
            return f"needs: {need}"
    if text == "python -m framework" or text.startswith("python -m framework "):
        return GENERIC
    return None


def run_by(test_file: str) -> list[Command]:
    """The commands `test_file` (a path from the repository root, or __file__) runs, in page order, each
    once."""
    name = str(Path(test_file).resolve().relative_to(REPO)) if Path(test_file).is_absolute() else test_file
    seen, out = set(), []
    for c in commands():
        if owner(c) == name and c.text not in seen:
            seen.add(c.text)
            out.append(c)
    return out


def block_of(command: Command) -> list[str]:
    """Every command line of the block `command` is in (a block whose lines depend on each other)."""
    return [line for line in logical_lines(bash_blocks(REPO / command.page)[command.block]) if "-m framework" in line]


def extras_of(page: str, through_block: int | None = None) -> tuple[str, ...]:
    """The extras `page` (a path from the repository root) tells its reader to install, in its bash blocks up to
    `through_block` (None: all of them)."""
    blocks = bash_blocks(REPO / page)[:None if through_block is None else through_block + 1]
    found = [m.group(1) for block in blocks for line in logical_lines(block) if (m := SETUP.match(line))]
    return tuple(dict.fromkeys(extra for group in found for extra in group.split(",")))


def environment(command: Command, base: dict | None = None) -> dict:
    """What a job running `command` adds to `base` (None: the test environment): README's install plus the
    extras its page says to install before it."""
    return readme_env.environment(extras_of(command.page, command.block), base)


def run_as_written(command: Command, cwd: Path, text: str | None = None, env: dict | None = None,
                   timeout: int = 900) -> subprocess.CompletedProcess:
    """`command` (or `text`, the command as a test shortened it) run by the shell in `cwd` with this interpreter
    for `python`, in the test's environment plus `env` and what its page says to install; fails the test if it
    fails."""
    text = (text or command.text).replace("python ", f"{sys.executable} ", 1)
    proc = subprocess.run(text, shell=True, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {}), **environment(command)})
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc
