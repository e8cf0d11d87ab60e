"""Weights & Biases through its own client: project logging.experiment, run name logging.run_name, files
under <run dir>/wandb. Online by default (after `wandb login`); WANDB_MODE=offline writes the run there
for a later `wandb sync`, where each attempt of a resumed job is a part of the same run id."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import uuid

from framework.metrics.trackers.base import Tracker, TrackerError, flat_params
from framework.redact import redacted

LOCAL_MODES = ("offline", "disabled", "dryrun")


@contextlib.contextmanager
def _command_line_redacted():
    """wandb.init records the process's command line (sys.argv) in the run's metadata, which may name a URL
    with its password: while it starts, it sees the command line redacted."""
    argv = list(sys.argv)
    sys.argv[:] = redacted(argv)
    try:
        yield
    finally:
        sys.argv[:] = argv


class WandbTracker(Tracker):
    name = "wandb"
    package = "wandb"

    @classmethod
    def probe(cls, cfg) -> None:
        if os.environ.get("WANDB_MODE", "online") in LOCAL_MODES:
            return
        import wandb
        try:
            # who the API key belongs to: one request
            wandb.Api(timeout=math.ceil(cfg.logging.tracker_timeout_s)).viewer
        except Exception as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrackerError(f"wandb: cannot reach {os.environ.get('WANDB_BASE_URL', 'api.wandb.ai')} as a "
                               f"logged-in user ({reason[:200]}); run `wandb login`, or set WANDB_MODE=offline") from None

    def start(self, cfg, run_dir: str, run_id: str | None) -> str:
        import wandb
        run_id = run_id or uuid.uuid4().hex[:12]
        with _command_line_redacted():
            self.run = wandb.init(project=cfg.logging.experiment, name=cfg.logging.run_name, id=run_id,
                                  resume="allow", dir=run_dir, config=flat_params(cfg), allow_val_change=True)
        return run_id

    def log(self, step: int, metrics: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({**metrics, **texts}, step=step)

    def log_summary(self, summary: dict) -> None:
        self.run.summary.update({f"summary/{key}": value for key, value in summary.items()})

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)
