"""What every Ray Train worker runs (framework.launch.ray): the framework's own worker (strategy, trainer,
metrics) on the resolved config the driver validated, in the process group Ray's torch backend formed, with
every metrics record also reported to Ray (`ray.train.report`), so Ray's dashboard and Ray Tune see them.

A worker group that Ray starts again after a failure (FailureConfig) continues the job: rank 0 counts the
group's attempts under the run dir and every rank gets the count as TORCHELASTIC_RESTART_COUNT, the variable
through which torch's elastic agent tells its workers the same, so resuming from the newest checkpoint
(framework.runtime.elastic) and fault injection's attempt= work alike under both engines.
"""
from __future__ import annotations

import os
import queue
import threading

from framework.runtime.elastic import MARKERS

REPORT_QUEUE = 1024


def _count_attempt(run_dir: str, run_id: str) -> int:
    """Rank 0: this attempt's number (0 for the first), marked under <run dir>/.agents/ for the next one."""
    os.makedirs(os.path.join(run_dir, MARKERS), exist_ok=True)
    attempt = 0
    while True:
        try:
            open(os.path.join(run_dir, MARKERS, f"ray_{run_id}_attempt_{attempt}"), "x").close()
            return attempt
        except FileExistsError:
            attempt += 1


def _agree_on_attempt(run_dir: str, run_id: str) -> int:
    import torch.distributed as dist
    found = [_count_attempt(run_dir, run_id) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    return found[0]


class RayReport:
    """Passes each metrics record to ray.train.report from a thread of its own: a report waits for every rank
    and for Ray's controller to take it (it polls every few seconds), and a training step must not. Every rank
    reports every record, in order (Ray keeps rank 0's); `close` waits until all are in."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue(REPORT_QUEUE)
        self._thread = threading.Thread(target=self._drain, name="ray-report", daemon=True)
        self._thread.start()

    def __call__(self, record: dict) -> None:
        self._queue.put({k: v for k, v in record.items() if isinstance(v, (int, float, str))})

    def _drain(self) -> None:
        import ray.train
        while (record := self._queue.get()) is not None:
            ray.train.report(record)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def train_loop(config: dict) -> None:
    """Ray Train's train_loop_per_worker."""
    os.environ.update(config["env"])
    if os.path.isdir(config["cwd"]):      # relative paths in the config mean what they meant to the driver
        os.chdir(config["cwd"])
    from omegaconf import OmegaConf

    from framework.parallel.process_group import default_timeouts
    from framework.train.worker import run_worker
    cfg = OmegaConf.create(config["config"])
    default_timeouts(cfg.launcher.timeout_s)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(_agree_on_attempt(config["run_dir"], config["run_id"]))
    report = RayReport()
    run_worker(cfg, config["run_dir"], on_record=report)
    report.close()
