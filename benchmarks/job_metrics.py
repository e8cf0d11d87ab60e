"""Run `python -m framework` for a benchmark and return its metrics records (nothing kept on disk)."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def job_metrics(args: list[str], steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "framework", *args, f"trainer.max_steps={steps}", "trainer.log_every=1",
               "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]",
               "checkpoint.enabled=false", f"hydra.run.dir={tmp}/run"]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        return [json.loads(line) for line in open(f"{tmp}/run/metrics.jsonl")]
