"""The package declares the torch range it runs on (a cluster image keeps its own CUDA build); only CI
pins one release, through the constraints file that .ci/run and the set-up commands use (README's, and the
same on docs/getting-started.md)."""
import re
import tomllib

from packaging.requirements import Requirement

from tests.harness.helpers import REPO

OLDEST_RUN = "2.11.0"      # every strategy ran on an H100 with 2.11.0+cu130
NEWEST_RELEASE = "2.15.0"


def _torch_requirement() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(Requirement(d) for d in deps if Requirement(d).name == "torch")


def test_the_torch_requirement_is_a_range_that_admits_the_tested_and_newest_releases():
    spec = _torch_requirement().specifier
    assert spec.contains(OLDEST_RUN) and spec.contains("2.11.0+cu130", prereleases=False)
    assert spec.contains(NEWEST_RELEASE) and spec.contains("2.13.0")
    assert not any(s.operator in ("==", "===") for s in spec), f"torch is pinned: {spec}"


def test_ci_and_readme_install_with_the_constraints_file_that_pins_the_ci_release():
    pins = re.findall(r"^torch==(\S+)$", (REPO / ".ci" / "constraints.txt").read_text(), re.M)
    assert pins and _torch_requirement().specifier.contains(pins[0])
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    installs = re.findall(r"^python3 -m venv .*$", readme, re.M)
    assert len(installs) == 2 and all("-c .ci/constraints.txt" in line for line in installs)
    assert installs[1] in ci, "README's test command is what .ci/run runs"
    started = (REPO / "docs" / "getting-started.md").read_text()
    assert re.findall(r"^python3 -m venv .*$", started, re.M) == installs, "getting started shows README's set-up"
