"""A real install: build a wheel, install it into a fresh virtual environment (no editable install,
no checkout on the path) and run the `framework` console script from an unrelated directory."""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.harness.helpers import REPO

SHORT = ["model=tiny", "data.seq_len=32", "trainer.max_steps=2", "trainer.eval_every=0",
         "trainer.progress_bar=false", "logging.trackers=[]", "checkpoint.enabled=false"]


def _clean_env() -> dict:
    """No PYTHONPATH: what runs must be the installed wheel, not a checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin dir, an unrelated working dir) with the wheel installed; torch and the other
    dependencies come from this interpreter's site-packages through a .pth line, so nothing is downloaded."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(REPO)], check=True, env=_clean_env(), cwd=root, timeout=300)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # Only the directory itself, not its .pth files: the editable install of a checkout stays out.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("framework-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, env=_clean_env(), timeout=300)
    work = root / "elsewhere"
    work.mkdir()
    return venv / "bin", work


def _run(installed, *args, timeout=600):
    bin_dir, work = installed
    return subprocess.run([str(bin_dir / "framework"), *args], cwd=work, env=_clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_is_the_wheel(installed):
    bin_dir, work = installed
    where = subprocess.run([str(bin_dir / "python"), "-c", "import framework; print(framework.__file__)"],
                           cwd=work, env=_clean_env(), capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(bin_dir.parent)) and str(REPO) not in where


def test_console_script_runs_the_default_job(installed):
    proc = _run(installed, "trainer.max_steps=2", "trainer.eval_every=0", "hydra.run.dir=default")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (installed[1] / "default" / "metrics.jsonl").is_file()


def test_console_script_applies_a_recipe(installed):
    proc = _run(installed, "+recipe=cpu_small_ddp", *SHORT, "trainer.global_batch_size=4",
                "trainer.micro_batch_size=2", "hydra.run.dir=recipe")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "name: ddp" in (installed[1] / "recipe" / "config.yaml").read_text()


def test_a_chat_recipe_trains_on_the_chats_the_wheel_ships(installed):
    proc = _run(installed, "+recipe=sft_tiny", "trainer.max_steps=2", "trainer.eval_every=0",
                "trainer.progress_bar=false", "checkpoint.enabled=false", "data.cache_dir=cache", "hydra.run.dir=sft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = (installed[1] / "sft" / "config.yaml").read_text()
    assert f"{os.sep}framework{os.sep}data{os.sep}assets{os.sep}tiny_chat.jsonl" in config and str(REPO) not in config
