"""Which lm-eval tasks an evaluation runs, found offline where they can be.

The shipped tasks (shipped/) and every include path are read first; only a task found in none of them is looked
up among lm-eval's own (which may fetch its data from the Hugging Face Hub, with the user's HF_HUB_OFFLINE
setting untouched). Otherwise both offline variables are set before lm_eval (and `datasets`, which reads them
when imported) is imported, so nothing reaches the network, and lm-eval's index of its own ~200 task folders
(17-27 s per process on two cores) is skipped."""
from __future__ import annotations

import logging
import os
import re
import sys

from framework.errors import installed

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped")
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
PACKAGE, EXTRA = "lm_eval", "eval"
GENERATIVE = "generate_until"
_NAME = re.compile(r"^(?:task|group|tag):\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


#: what a job's workers import to score eval.tasks (framework.train.task_scores), ~1 s of CPU in each
WORKER_MODULES = ("framework.evaluation.harness", "framework.evaluation.scores", "lm_eval.evaluator", "lm_eval.tasks")


class TaskError(ValueError):
    """A task that cannot be run (unknown, its data missing) or a folder of tasks that is not one; `argument`:
    which of the two the caller names, "tasks" or "include_path"."""

    def __init__(self, message: str, argument: str = "tasks"):
        super().__init__(message)
        self.argument = argument


def _yaml_files(folder: str):
    for root, _, files in os.walk(folder):
        yield from (os.path.join(root, f) for f in sorted(files) if f.endswith((".yaml", ".yml")))


def local_names(include_paths: list[str]) -> set[str]:
    """The task, group and tag names the YAMLs of the shipped tasks and of `include_paths` declare (read as text:
    lm_eval may not be imported yet)."""
    names: set[str] = set()
    for folder in (SHIPPED, *include_paths):
        for path in _yaml_files(folder):
            with open(path, encoding="utf-8", errors="replace") as f:
                names.update(_NAME.findall(f.read()))
    return names


def go_offline(names: list[str], include_paths: list[str]) -> bool:
    """Set the offline variables (unless the user set either) where every task is local; True if so."""
    local = set(names) <= local_names(include_paths)
    if local and not any(v in os.environ for v in OFFLINE):
        os.environ.update(dict.fromkeys(OFFLINE, "1"))
        # what read the variables when imported before this (a data source of `datasets`) is told too
        if "datasets" in sys.modules:
            sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True
    return local


class _QuietCustomLoader(logging.Filter):
    """lm-eval warns, at every load of a task with a `custom_dataset` (the shipped ones), how to pass it
    arguments; nothing a user of these tasks can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


def load_tasks(names: list[str], include_paths: list[str]):
    """(lm_eval's TaskManager, {name: its loaded tasks}) for `names`; TaskError (one line) for lm-eval not
    installed, an include path that is not a folder, an unknown task, or one whose data cannot be read."""
    if not installed(PACKAGE):
        raise TaskError(f"needs lm-evaluation-harness, which is not installed: pip install 'framework[{EXTRA}]'")
    for folder in include_paths:
        if not os.path.isdir(folder):
            raise TaskError(f"{folder} is not a folder", "include_path")
    local = go_offline(names, include_paths)
    import datasets
    from lm_eval.tasks import TaskManager
    datasets.disable_progress_bars()
    logging.getLogger("lm_eval.api.task").addFilter(_QuietCustomLoader())
    manager = TaskManager(include_path=[SHIPPED, *include_paths], include_defaults=not local)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        here = sorted(set(manager.all_tasks) & local_names(include_paths)) if not local else sorted(manager.all_tasks)
        raise TaskError(f"{unknown[0]!r} is not a task lm-eval knows (found here: {', '.join(here)}; a folder of "
                        f"your own task YAMLs goes in the include path)")
    loaded = {}
    for name in names:
        try:
            loaded[name] = manager.load([name])["tasks"]
        except Exception as e:     # noqa: BLE001 (datasets and the tasks' own loaders raise any kind)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TaskError(f"task {name}: its data cannot be read ({type(e).__name__}: {first[:300]})") from None
    return manager, loaded


def generative(loaded: dict) -> list[str]:
    """The requested names (of `load_tasks`'s answer) that generate text rather than score it."""
    return [name for name, tasks in loaded.items()
            if any(t.get_config("output_type") == GENERATIVE for t in tasks.values())]
