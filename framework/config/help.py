"""`python -m framework --help`: the groups and options a user picks (not the schema/... groups that Hydra's
own help would list beside them), and every key of the sections that are not groups, described from the
schema as the generated reference (`python -m framework.reference`, docs/reference/config.md) does."""
from __future__ import annotations

import dataclasses

from framework.config import schema
from framework.config.describe import KeyDoc, describe
from framework.config.paths import CONFIG_DIR

REFERENCE = "docs/reference/config.md"

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


def sections() -> dict[str, list[KeyDoc]]:
    """The parts of the config that are not groups (trainer, checkpoint, ...; "" for top-level keys), row by
    row: what --help and the reference both print."""
    groups = set(user_groups())
    fields = [f for f in dataclasses.fields(schema.Config) if f.name not in groups]
    out = {"": describe(schema.Config, names=tuple(f.name for f in fields if not _is_section(f)))}
    out.update({f.name: describe(schema.Config, names=(f.name,)) for f in fields if _is_section(f)})
    return out


def _is_section(f: dataclasses.Field) -> bool:
    return f.default_factory is not dataclasses.MISSING


def _line(row: KeyDoc) -> str:
    setting = f"{row.key}={row.default}"
    allowed = f" ({row.allowed.replace(', ', '|')})" if row.allowed else ""
    return f"  {setting:<40} {row.meaning}{allowed}"


def help_text() -> str:
    chosen = defaults()
    lines = [USAGE]
    for group, options in user_groups().items():
        marked = [f"{o}*" if chosen.get(group) == o else o for o in options]
        prefix = "+" if group not in chosen else ""
        lines.append(f"  {prefix}{group}: {', '.join(marked)}")
    lines.append("\nOther keys (key=default  meaning):")
    for rows in sections().values():
        lines += [_line(row) for row in rows]
    lines.append(f"\nEvery key of every group option, with its type and allowed values: {REFERENCE}, which\n"
                 "`python -m framework.reference` prints. Hydra's own options: --hydra-help.")
    return "\n".join(lines)
