"""`python -m framework --help`: the groups and options a user picks, not the schema/... groups that
Hydra's own help would list beside them (the schemas live in its ConfigStore only to type the yaml)."""
from __future__ import annotations

from framework.config.paths import CONFIG_DIR

USAGE = """framework: declarative training for PyTorch.

  python -m framework [group=option ...] [key=value ...]      (or: framework ...)
  python -m framework -m key=a,b ...                          a sweep: one job and run dir per point
  python -m framework +recipe=<recipe> [overrides]            a recipe, then overrides on top
  python -m framework [overrides] --cfg job                   print the composed config and exit

Config groups (pick one option each; the default is marked *):
"""


def user_groups() -> dict[str, list[str]]:
    return {d.name: sorted(p.stem for p in d.glob("*.yaml"))
            for d in sorted(CONFIG_DIR.iterdir()) if d.is_dir() and any(d.glob("*.yaml"))}


def defaults() -> dict[str, str]:
    import yaml
    entries = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())["defaults"]
    return {k: v for entry in entries if isinstance(entry, dict) for k, v in entry.items()}


def help_text() -> str:
    chosen = defaults()
    lines = [USAGE]
    for group, options in user_groups().items():
        marked = [f"{o}*" if chosen.get(group) == o else o for o in options]
        prefix = "+" if group not in chosen else ""
        lines.append(f"  {prefix}{group}: {', '.join(marked)}")
    lines.append("\nOther sections: trainer.*, checkpoint.*, launcher.*, logging.*, planner.*, seed, device; "
                 "see README.md. Hydra's own options: --hydra-help.")
    return "\n".join(lines)
