"""What the launcher's fork server imports for a strategy's workers. The server skips a module that
fails to import without a word, so a renamed module would silently cost every worker its import again;
and on a GPU nothing it imports may initialise CUDA, which a forked worker could then not use."""
import json
import os
import subprocess
import sys

from framework.launch.preload import fork_server_preload
from framework.strategies.registry import STRATEGIES
from tests.harness.helpers import REPO


def _preload(device: str, guard_cuda: bool) -> dict:
    """Import each strategy's preload in one fresh process after framework.train.worker (the server's own
    first import); return the modules per strategy and what asked CUDA anything meanwhile."""
    code = f"""
import importlib, json, os, sys
import torch
from omegaconf import OmegaConf
from framework.strategies.registry import strategy_class
import framework.train.worker
asked = []
def _refuse(name):
    def ask(*a, **k):
        asked.append(name)
        raise RuntimeError(name + " called while preloading")
    return ask
if {guard_cuda!r}:
    for name in ("is_available", "device_count", "init", "_lazy_init", "current_device"):
        setattr(torch.cuda, name, _refuse(name))
cfg = OmegaConf.create({{"device": {device!r}, "zero": {{"stage": 1}}, "parallel": {{"pp": 2}}}})
out = {{}}
for s in {list(STRATEGIES)!r}:
    mods = strategy_class(s).worker_preload(cfg)
    for m in mods:
        importlib.import_module(m)
    out[s] = list(mods)
print(json.dumps({{"modules": out, "asked": asked, "ds_accelerator": os.environ.get("DS_ACCELERATOR")}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_module_a_cpu_job_preloads_exists_and_deepspeed_gets_its_accelerator_first():
    got = _preload("cpu", guard_cuda=False)
    mods = got["modules"]
    assert "torch.distributed.pipelining" in mods["3d"] and "deepspeed" in mods["deepspeed"]
    assert "torch.distributed.optim" in mods["ddp"] and "framework.parallel.parallelize" in mods["fsdp"]
    # DeepSpeed picks its accelerator on import: the server must see what the workers will set
    assert got["ds_accelerator"] == "cpu"


def test_the_server_leaves_without_teardown_imported_last_before_it_forks_workers(monkeypatch):
    import multiprocessing
    from multiprocessing import forkserver

    from framework.launch.torch import start_fork_server
    preloaded = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", preloaded.extend)
    monkeypatch.setattr(forkserver, "ensure_running", lambda: None)
    start_fork_server(("framework.parallel.parallelize",))
    assert preloaded[-1:] == ["framework.launch.fork_server_exit"]


def test_what_a_gpu_job_preloads_never_asks_cuda():
    got = _preload("cuda", guard_cuda=True)
    assert got["asked"] == [], got["asked"]
    assert got["modules"]["3d"] and got["modules"]["deepspeed"] == []


def test_a_job_is_not_made_to_wait_for_costly_modules_its_workers_never_use():
    from omegaconf import OmegaConf

    from framework.strategies.registry import strategy_class
    plain = OmegaConf.create({"device": "cpu", "zero": {"stage": 0}, "parallel": {"pp": 1}})
    assert "torch.distributed.optim" not in strategy_class("ddp").worker_preload(plain)
    assert "torch.distributed.pipelining" not in strategy_class("3d").worker_preload(plain)


def _what_a_worker_finds(queue) -> None:
    queue.put((os.getppid(), "wave" in sys.modules, "tabnanny" in sys.modules))


def _fork_a_worker():
    import multiprocessing
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.Queue()
    child = ctx.Process(target=_what_a_worker_finds, args=(queue,))
    child.start()
    found = queue.get(timeout=60)
    child.join(timeout=60)
    return found


def test_a_sweep_keeps_the_server_its_first_point_started(tmp_path):
    """A sweep's launcher keeps its fork server from point to point: a point needing modules the server did not
    preload has its workers import them (replacing the server needs multiprocessing's private internals). In a
    process of its own, whose server nothing else started."""
    code = f"""
import json, os, sys
sys.path.insert(0, {str(REPO)!r})
from framework.launch import torch as launcher
from tests.unit.launch.test_fork_server_preload import _fork_a_worker
if __name__ == "__main__":
    launcher.start_fork_server(("wave",))
    first = _fork_a_worker()
    launcher.start_fork_server(("tabnanny",))
    second = _fork_a_worker()
    print(json.dumps([first, second]))
"""
    (tmp_path / "sweep_points.py").write_text(code)
    proc = subprocess.run([sys.executable, str(tmp_path / "sweep_points.py")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first[1:] == [True, False]
    assert second == first                         # the same server: its workers import tabnanny themselves


def test_a_cpu_job_preloads_what_its_model_float8_and_compile_import_and_each_exists(compose_config, tmp_path):
    from framework.strategies.registry import strategy_class
    from tests.matrix.crossed import smallest_overrides
    job = ["parallel=fsdp", "precision=float8", "trainer.compile=true", "device=cpu",
           *smallest_overrides("hf", str(tmp_path))]
    cpu = fork_server_preload(strategy_class("fsdp"), compose_config(job))
    for wanted in ("transformers.models.llama.modeling_llama", "torchao.float8", "torch._inductor.pattern_matcher"):
        assert wanted in cpu, cpu
    proc = subprocess.run([sys.executable, "-c", f"import importlib\nfor m in {list(cpu)!r}: importlib.import_module(m)"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # on a GPU only the strategy's own (what the other imports might ask CUDA is not known)
    gpu = fork_server_preload(strategy_class("fsdp"), compose_config([*job[:-1], "device=cuda"]))
    assert gpu == strategy_class("fsdp").worker_preload(compose_config(job))


def test_a_sweep_names_more_modules_for_its_server_and_a_module_that_does_not_exist_is_refused(compose_config,
                                                                                              monkeypatch):
    """launcher.preload: a sweep mixing strategies or model families names their union, and its fork server
    starts once with all of it. The server itself skips
    a module it cannot import without a word, so a name that is not a module is refused before launch."""
    import pytest

    from framework.errors import ConfigError
    from framework.launch import torch as launcher
    from framework.strategies.registry import strategy_class
    from tests.harness.helpers import validate_composed
    served = []
    monkeypatch.setattr(launcher, "start_fork_server", lambda modules, signals: served.append(modules))
    cfg = compose_config(["parallel=ddp", "device=cpu", "launcher.preload=[wave,tabnanny]"])
    validate_composed(cfg)
    launcher.TorchEngine(cfg, strategy_class("ddp"), 2).prepare()
    assert served == [(*fork_server_preload(strategy_class("ddp"), cfg), "wave", "tabnanny")]
    with pytest.raises(ConfigError, match=r"launcher.preload: 'no_such_module_x' is not a module"):
        validate_composed(compose_config(["launcher.preload=[wave,no_such_module_x]"]))


def test_a_cpu_job_scoring_eval_tasks_preloads_lm_eval_once_for_its_workers(compose_config):
    """Each of a scoring job's workers would import lm-eval again (~1 s of CPU each); a module the server cannot
    import it skips without a word."""
    import importlib

    from framework.evaluation.tasks import WORKER_MODULES
    from framework.strategies.registry import strategy_class
    fsdp = ["model=tiny", "parallel=fsdp", "device=cpu"]
    scored = fork_server_preload(strategy_class("fsdp"), compose_config([*fsdp, "eval.tasks=[fw_pytext]"]))
    assert set(WORKER_MODULES) <= set(scored)
    assert not set(WORKER_MODULES) & set(fork_server_preload(strategy_class("fsdp"), compose_config(fsdp)))
    for module in WORKER_MODULES:
        importlib.import_module(module)
