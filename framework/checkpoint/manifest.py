"""The size and CRC-32 of every file of a checkpoint, recorded in its meta.json when it is saved and
checked before it is loaded, so a copy cut short or a flipped block is refused before any work.

CRC-32 (zlib) reads the files back once after they are written, while they are still in the page
cache; benchmarks/checkpoint_manifest_cost.py measures what that adds to a save.
"""
from __future__ import annotations

import os
import zlib

CHUNK = 4 << 20


def crc32_of(path: str) -> str:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def build_manifest(step_dir: str, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """{relative path: {"size": bytes, "crc32": hex}} for every file under step_dir but `skip`."""
    manifest = {}
    for parent, _, names in os.walk(step_dir):
        for name in names:
            path = os.path.join(parent, name)
            rel = os.path.relpath(path, step_dir)
            if rel not in skip:
                manifest[rel] = {"size": os.path.getsize(path), "crc32": crc32_of(path)}
    return dict(sorted(manifest.items()))


def first_damage(step_dir: str, manifest: dict[str, dict]) -> str | None:
    """What is wrong with the first damaged file, or None when every file matches. Reads, never writes."""
    for rel, expected in manifest.items():
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            return f"{path} is missing"
        size = os.path.getsize(path)
        if size != expected["size"]:
            return f"{path} is damaged: {size} bytes, {expected['size']} when saved"
    for rel, expected in manifest.items():
        path = os.path.join(step_dir, rel)
        if crc32_of(path) != expected["crc32"]:
            return f"{path} is damaged: its checksum differs from the one saved"
    return None
