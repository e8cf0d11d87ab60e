"""The numbers table of docs/how-to/evaluation.md: the shipped tasks' scores of model=tiny after 100 and 200 steps.

    python benchmarks/evaluation_steps.py [--out /tmp/evaluation_steps]

Trains `python -m framework model=tiny trainer.max_steps=200 checkpoint.interval=100` and scores each of its two
checkpoints with `python -m framework.eval STEP --tasks fw_pyfacts,fw_pytext` on every row of both tasks (no
--limit), then prints the page's table. Training and scoring are deterministic on one machine, so a rerun prints
the same numbers; a finished run in --out is reused (delete it to train again). The page's own commands train 8
steps and score 20 rows, so that its test runs them as written in seconds; their scores say nothing yet.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TASKS = "fw_pyfacts,fw_pytext"
STEPS = (100, 200)
TRAIN = ["model=tiny", "trainer.max_steps=200", "checkpoint.interval=100"]
COLUMNS = [("fw_pyfacts", "acc", 3), ("fw_pyfacts", "acc_norm", 3), ("fw_pytext", "bits_per_byte", 3),
           ("fw_pytext", "byte_perplexity", 2)]


def _run(args: list[str]) -> None:
    subprocess.run([sys.executable, *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/evaluation_steps"))
    out = parser.parse_args().out
    run = out / "tiny"
    last = run / "checkpoints" / f"step_{STEPS[-1]:08d}"
    if not (last / "meta.json").exists():
        _run(["-m", "framework", *TRAIN, "trainer.progress_bar=false", f"hydra.run.dir={run}"])
    rows = []
    for step in STEPS:
        scored = out / f"step_{step}.json"
        if not scored.exists():
            _run(["-m", "framework.eval", str(run / "checkpoints" / f"step_{step:08d}"), "--tasks", TASKS,
                  "--out", str(scored)])
        values = {(s["task"], s["metric"]): s["value"] for s in json.loads(scored.read_text())["scores"]}
        rows.append(f"| step {step} | " + " | ".join(f"{values[t, m]:.{digits}f}" for t, m, digits in COLUMNS) + " |")
    print("| model=tiny | " + " | ".join(f"{t} {m}" for t, m, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
