"""`python -m framework.compare RUN_DIR... [--out FILE.png]`: runs' loss curves (val_loss as points) and
tokens/s side by side in one PNG, and a line per run with its last loss, val_loss and median tokens/s.

A run dir is what a job writes (its metrics.jsonl); a sweep dir (outputs/multirun/<date>/<time>) stands for
every point in it. Each run is labelled by the overrides that set it apart from the others (from Hydra's
.hydra/overrides.yaml), else by its path. Plotting needs matplotlib: pip install 'framework[plots]'.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from framework import exit_codes
from framework.errors import ConfigError

METRICS = "metrics.jsonl"


def run_dirs(paths: list[str]) -> list[Path]:
    """The run dirs the paths name: a run dir itself, or every run under a sweep dir."""
    runs = []
    for raw in paths:
        path = Path(raw)
        if (path / METRICS).is_file():
            runs.append(path)
            continue
        points = sorted((m.parent for m in path.glob(f"*/{METRICS}")), key=lambda p: (len(p.name), p.name))
        if not points:
            raise ConfigError(raw, f"no {METRICS} in it or in its subdirectories: not a run or sweep dir")
        runs += points
    return runs


def records(run: Path) -> list[dict]:
    out = []
    for n, line in enumerate((run / METRICS).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(str(run / METRICS), f"line {n} is not JSON") from None
    return [r for r in out if "step" in r]


def labels(runs: list[Path]) -> list[str]:
    """Each run's overrides that the other runs do not share; its path where that says nothing."""
    import yaml
    overrides = []
    for run in runs:
        saved = run / ".hydra" / "overrides.yaml"
        overrides.append(yaml.safe_load(saved.read_text()) or [] if saved.is_file() else [])
    shared = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    out = [" ".join(o for o in own if o not in shared and not o.startswith("hydra.")) or "defaults"
           for own in overrides]
    return out if len(set(out)) == len(out) else [str(run) for run in runs]


def summary(label: str, rows: list[dict]) -> str:
    def last(key):
        values = [r[key] for r in rows if key in r]
        return f"{values[-1]:.4f}" if values else "-"
    rates = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
    rate = f"{statistics.median(rates):,.0f}" if rates else "-"
    step = rows[-1]["step"] if rows else 0
    return f"{label}: step {step}, loss {last('loss')}, val_loss {last('val_loss')}, {rate} tokens/s (median)"


def plot(curves: dict[str, list[dict]], out: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--out", "plotting needs matplotlib: pip install 'framework[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (loss_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, rows in curves.items():
        line, = loss_ax.plot([r["step"] for r in rows if "loss" in r], [r["loss"] for r in rows if "loss" in r],
                             label=label)
        evals = [r for r in rows if "val_loss" in r]
        loss_ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o", color=line.get_color())
        rated = [r for r in rows if "tokens_per_sec" in r]
        rate_ax.plot([r["step"] for r in rated], [r["tokens_per_sec"] for r in rated], color=line.get_color(),
                     label=label)
    loss_ax.set(title="loss", xlabel="step", ylabel="loss (points: val_loss)")
    rate_ax.set(title="throughput", xlabel="step", ylabel="tokens/s")
    for ax in (loss_ax, rate_ax):
        ax.grid(alpha=0.3)
    loss_ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run dirs, or sweep dirs (every point)")
    parser.add_argument("--out", default="compare.png", help="the PNG to write (default: compare.png)")
    args = parser.parse_args(argv)
    try:
        runs = run_dirs(args.runs)
        curves = {label: records(run) for label, run in zip(labels(runs), runs)}
        for label, rows in curves.items():
            print(summary(label, rows))
        plot(curves, Path(args.out))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.USAGE
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
