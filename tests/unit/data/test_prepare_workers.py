"""`prepare`'s tokenizing workers: one whose start fails, or that dies, stops the run at once in one line, and
nothing is left behind (multiprocessing.Pool restarted a worker whose initializer raised, forever: 23,578
tracebacks in 694 s and a `.partial-<pid>` folder, where transformers was not installed). Each case runs
`python -m framework.data.prepare`'s main in a fresh interpreter whose workers meet the fault: transformers
hidden from the workers (sys.modules), with the main process's check of it bypassed, or a task that kills
its worker."""
import os
import subprocess
import sys
import time

import pytest

from framework.data.assets import path as asset_path

#: run in a fresh interpreter: FAULT's lines, then prepare's main on the package's chats with the ChatML template
SCRIPT = """
import os, sys
import framework.data.chat as chat
import framework.data.prepare as prepare
{fault}
sys.exit(prepare.main(["--input", {chats!r}, "--tokenizer", "bytes", "--chat-template", "chatml", "--out", {out!r},
                       "--workers", "2"]))
"""
# the main process's check passes; the workers' Renderer then cannot import transformers
IMPORT_BLOCKED_IN_WORKERS = """
prepare.check_renderer = chat.check_renderer = lambda template: None
sys.modules["transformers"] = None
"""
# only the main process's check is bypassed: the workers' own check finds transformers missing
CHECKED_IN_WORKERS = """
prepare.check_renderer = lambda template: None
sys.modules["transformers"] = None
"""
WORKER_DIES = """
def die(examples):
    os._exit(3)
prepare.encode_examples = die
"""


def _prepare_with(fault: str, tmp_path):
    out = tmp_path / "data" / "chats"
    code = SCRIPT.format(fault=fault, chats=str(asset_path("tiny_chat.jsonl")), out=str(out))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, time.monotonic() - started, out


@pytest.mark.parametrize("fault,code,line", [
    (IMPORT_BLOCKED_IN_WORKERS, 1, "error: a tokenizing worker failed: ModuleNotFoundError: import of transformers"),
    (CHECKED_IN_WORKERS, 2, "error: --chat-template chatml: chat templates are rendered by transformers, which is "
                            "not installed: pip install 'framework[hf]'"),
    (WORKER_DIES, 1, "error: a tokenizing worker process died (killed, or out of memory?)"),
], ids=["initializer-import-fails", "initializer-check-fails", "worker-dies"])
def test_a_worker_that_cannot_start_or_dies_stops_prepare_in_one_line_leaving_nothing(tmp_path, fault, code, line):
    proc, seconds, out = _prepare_with(fault, tmp_path)
    assert proc.returncode == code, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("prepare:")]   # tqdm's bar
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and seconds < 60
    assert not out.exists() and not (tmp_path / "data").exists()      # no .partial-<pid>, nor the folder made for it


def test_a_worker_failure_under_the_framework_is_one_line_naming_the_data(monkeypatch, tmp_path):
    """data=chat prepares at launch: a worker failure (not the data's fault) ends the launch with one line and
    exit 1, where a ConfigError would say exit 2."""
    from omegaconf import OmegaConf
    from framework.data import prepare
    from framework.data.sources.chat import Chat
    from framework.config.schema import DataConfig

    def fails(*args, **kwargs):
        raise prepare.PrepareFailed("a tokenizing worker process died (killed, or out of memory?)")
    monkeypatch.setattr(prepare, "prepare", fails)
    cfg = OmegaConf.structured(DataConfig(name="chat", source="chat", path=str(asset_path("tiny_chat.jsonl")),
                                          tokenizer="bytes", cache_dir=str(tmp_path)))
    with pytest.raises(SystemExit) as stopped:
        Chat().resolve(cfg)
    assert stopped.value.code == (f"error: data.path: {asset_path('tiny_chat.jsonl')}: a tokenizing worker process "
                                  f"died (killed, or out of memory?)")
