"""mkdocs hook: a page under docs/how-to/ that mkdocs.yml's nav does not list yet is added to the How-to
guides section under its first heading, so a new guide is on the site as soon as it is in the directory."""
from __future__ import annotations

from pathlib import Path

SECTION = "How-to guides"
FOLDER = "how-to"


def _listed(nav) -> set[str]:
    found = set()
    for entry in nav if isinstance(nav, list) else [nav]:
        if isinstance(entry, str):
            found.add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                found |= _listed(value)
    return found


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def on_config(config):
    nav = config["nav"]
    section = next(entry[SECTION] for entry in nav if isinstance(entry, dict) and SECTION in entry)
    listed = _listed(nav)
    for page in sorted((Path(config["docs_dir"]) / FOLDER).glob("*.md")):
        name = f"{FOLDER}/{page.name}"
        if name not in listed:
            section.append({_title(page): name})
    return config
