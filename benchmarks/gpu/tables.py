"""The GPU session's results as the Markdown tables docs/benchmarks/gpu-session.md holds, one per stage, each
under the device, torch and commit it ran on, and under it the last log lines of each row that failed:

    python -m benchmarks.gpu.tables DIR [DIR ...]

DIR is a results folder a session wrote (--out): the files the device tool brought back.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.gpu.session import STAGES
from benchmarks.gpu.stage import Stage


def _note(row: dict) -> str:
    for key, label in (("error", "failed: "), ("skipped", "skipped: "), ("refused", "refused before launch: ")):
        if row.get(key):
            return label + str(row[key]).replace("|", "/")
    return ""


def table(stage: Stage, lines: list[dict]) -> str:
    env = next((line for line in lines if line["kind"] == "env"), None)
    out = [f"### {stage.name}", ""]
    skipped = [line for line in lines if line["kind"] == "skipped"]
    if env:
        where = f"{env['gpu'] or 'CPU'}, torch {env['torch']}, commit `{env['commit']}`"
        out += [f"{where}{' (a dry run: tiny sizes)' if env.get('dry_run') else ''}", ""]
    out += [f"Skipped: {line['why']}" for line in skipped] + ([""] if skipped else [])
    rows = [line for line in lines if line["kind"] == "row"]
    if rows:
        out.append("| job | " + " | ".join(col.title for col in stage.columns) + " | note |")
        out.append("|---" * (len(stage.columns) + 2) + "|")
        for row in rows:
            cells = [str(col.show(row.get(col.key))).replace("|", "/") for col in stage.columns]
            out.append(f"| {row['job']} | " + " | ".join(cells) + f" | {_note(row)} |")
    for row in rows:
        if row.get("log_tail"):
            out += ["", f"`{row['job']}`, the last lines of its log:", "", "```text", *row["log_tail"], "```"]
    return "\n".join(out)


def tables(folders: list[Path]) -> str:
    parts = []
    for stage in STAGES.values():
        lines = []
        for folder in folders:
            path = folder / f"{stage.name}.jsonl"
            if path.exists():
                lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if lines:
            parts.append(table(stage, lines))
    return "\n\n".join(parts)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(tables([Path(a) for a in sys.argv[1:]]))
