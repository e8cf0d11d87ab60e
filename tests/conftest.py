import json
import os
from pathlib import Path

# Before torch loads OpenMP (here and in every job, which inherits it): a thread that finished its share of
# an op sleeps instead of spinning. pytest-xdist runs two workers' jobs on the 2 cores, and threads spinning
# in one job took the cores the other needed: four layout-test files took 218 s with spinning, 154 s without.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from framework.config.paths import CONFIG_DIR  # noqa: E402
from framework.launch import admission  # noqa: E402
from framework.compose.config_store import register_configs  # noqa: E402
from tests.harness.helpers import FAST, check_ok, losses, run_framework  # noqa: E402

#: what trained_run adds to FAST: checkpoints at steps 4 and 8
CHECKPOINTED = ("checkpoint.enabled=true", "checkpoint.interval=4")

#: a JSON file {"<a run's arguments, joined by spaces>": run dir} of runs a session may read instead of
#: training them: tests/harness/test_planted_bugs.py hands its clean runs to the sessions it starts with a bug
#: planted, which must not train their references with the bug
REUSE = "FRAMEWORK_TEST_REUSE_RUNS"

#: the runs trained (or reused) in this session for the fixtures below: arguments -> run dir
RUNS: dict[tuple[str, ...], Path] = {}


def shared_run(tmp_path_factory, args: tuple[str, ...]) -> Path:
    """Run dir of `python -m framework ARGS`, trained once per session (tests must not write into it)."""
    if args not in RUNS and os.environ.get(REUSE):
        found = json.loads(Path(os.environ[REUSE]).read_text()).get(" ".join(args))
        if found:
            RUNS[args] = Path(found)
    if args not in RUNS:
        run_dir = tmp_path_factory.mktemp("run")
        check_ok(run_framework(list(args), run_dir))
        RUNS[args] = run_dir
    return RUNS[args]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """Run dir of an uninterrupted FAST run of a layout with checkpoints at steps 4 and 8, trained once
    per session for every test that reads it (resume, resharding, export). `base` replaces FAST plus
    checkpoints (another model's arguments). Tests must not write into it."""
    return lambda *layout, base=(*FAST, *CHECKPOINTED): shared_run(tmp_path_factory, (*base, *layout))


#: the sft_tiny recipe (a chat model: ChatML, its template in the checkpoint) for one step, saved at step 1 and
#: scored there in its chat template on 2 documents of each shipped task and of fixtures/eval_tasks' fw_test_answer
SFT_TINY = ("+recipe=sft_tiny", "trainer.max_steps=1", "trainer.eval_every=0", "trainer.progress_bar=false",
            "checkpoint.enabled=true", "logging.trackers=[]", "eval.tasks=[fw_pyfacts,fw_pytext,fw_test_answer]",
            f"eval.include_path=[{Path(__file__).parent / 'fixtures' / 'eval_tasks'}]", "eval.limit=2", "eval.every=1",
            "eval.apply_chat_template=true")


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory, trained_run):
    """Run dir of SFT_TINY (its prepared data in a cache of the session's own), trained once per session for
    every test that reads a chat checkpoint. Tests must not write into it."""
    return trained_run(*SFT_TINY, f"data.cache_dir={tmp_path_factory.getbasetemp() / 'sft_cache'}", base=())


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, trained_run):
    """Run dir of parallel=single on FAST plus extra args, saving its final checkpoint, trained once per
    distinct args. With none, the checkpointed run trained_run("parallel=single") serves (one job fewer)."""
    def get(*extra: str) -> Path:
        if not extra:
            return trained_run("parallel=single")
        return shared_run(tmp_path_factory, (*FAST, "parallel=single", "checkpoint.enabled=true", *extra))
    return get


@pytest.fixture(scope="session")
def single_reference(reference_run):
    """Losses of reference_run(*extra) (tests/harness/parity.py's assert_parity compares whole runs instead)."""
    return lambda *extra: losses(reference_run(*extra))


@pytest.fixture(scope="module")
def compose_config():
    """Compose conf/ in-process exactly as `python -m framework OVERRIDES` would (no run, no workers)."""
    register_configs()
    OmegaConf.register_new_resolver("fw_run_dir", admission.agree_run_dir, replace=True)
    OmegaConf.register_new_resolver("fw_hydra_subdir", admission.hydra_output_subdir, replace=True)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        yield lambda overrides: compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="session")
def mlflow_root(tmp_path_factory):
    """Where the session's MLflow server keeps everything: its sqlite store, its artifacts, its log."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="session")
def mlflow_server(mlflow_root):
    """A real `mlflow server` on a free local port with a sqlite store, started once per session (it takes a
    few seconds); its tracking URI."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    root = mlflow_root
    log = open(root / "server.log", "w")
    # A free port is free only until someone binds it: the other pytest-xdist worker's jobs bind ports too, and
    # the server takes seconds to start. One that lost its port exits; it is started again on another.
    for attempt in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                 f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
                time.sleep(0.2)
        if proc.poll() is None:
            break
        assert "address already in use" in (root / "server.log").read_text(), (root / "server.log").read_text()[-3000:]
    else:
        raise AssertionError("mlflow server: five ports taken before it could bind them")
    try:
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # a test server: nothing of it is kept
        proc.wait()
        log.close()


@pytest.fixture(scope="session")
def s3_env():
    """An S3 server (moto) for the session: the environment (AWS_ENDPOINT_URL, credentials) that reaches it."""
    from tests.harness.servers import start_s3_server
    server, env = start_s3_server()
    yield env
    server.stop()


@pytest.fixture
def s3_here(s3_env, monkeypatch):
    """This process reaches the session's S3 server too (tests that read a bucket in-process), with no S3 file
    system fsspec made before: it hands a cached one back, made under another test's environment."""
    from tests.harness.servers import forget_s3_file_systems
    for key, value in s3_env.items():
        monkeypatch.setenv(key, value)
    forget_s3_file_systems()
    yield s3_env
    forget_s3_file_systems()


def pytest_addoption(parser):
    parser.addoption("--matrix-plan-only", action="store_true",
                     help="check the combination matrix's plan (tests/matrix/test_matrix.py) without training its jobs")


def pytest_configure(config):
    # pytest-xdist hands out files by their number of tests, most first, unless told to keep this order
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):      # once, in the process that starts the workers
        _byte_compile_the_checkout()


def _byte_compile_the_checkout() -> None:
    """The jobs that need an interpreter of their own (Ray's workers, torchrun, a planted bug's session, a
    job setting what torch reads at start) import the framework from its sources. With PYTHONDONTWRITEBYTECODE
    set, as on CI's machine, none of them kept what it compiled, and each compiled every module again (~1 s
    of CPU a process, some 300 processes a run). compileall writes the .pyc files whatever that variable says."""
    import compileall
    root = Path(__file__).resolve().parents[1]
    for package in ("framework", "tests"):
        compileall.compile_dir(root / package, quiet=1)


def pytest_collection_modifyitems(items):
    """Modules that say `RUNS_LONGEST = True` first: pytest-xdist hands out files in this order, and a
    module of many minutes started last would run alone at the end while the other workers idle."""
    items.sort(key=lambda item: not getattr(item.module, "RUNS_LONGEST", False))


#: a test hands lines to the end of the session's report as (SUMMARY, (title, lines)) in its user_properties,
#: which pytest-xdist carries from its workers to the process that prints the report
SUMMARY = "session summary"
SECTIONS: dict[str, list[str]] = {}


def summarize(item, title: str, lines: list[str]) -> None:
    """Print LINES under TITLE at the end of the session, whichever process ran the test ITEM."""
    item.user_properties.append((SUMMARY, (title, list(lines))))


def pytest_runtest_logreport(report):
    if report.when == "teardown":          # every report of a test carries its properties; the last counts
        for key, value in report.user_properties:
            if key == SUMMARY:
                title, lines = value
                SECTIONS.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter):
    """What the combination matrix covered and refused (tests/matrix/test_matrix.py), and
    tests/harness/test_planted_bugs.py's report: each planted bug and the tests that caught it."""
    for title, lines in SECTIONS.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
