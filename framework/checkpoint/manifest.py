"""The size and CRC-32 of every file of a checkpoint, recorded in its meta.json when it is saved and
checked before it is loaded, so a copy cut short or a flipped block is refused before any work.

CRC-32 (zlib) reads the files back once after they are written, while they are still in the page
cache; benchmarks/checkpoint_manifest_cost.py measures what that adds to a save. In a job of several
ranks each rank checksums its share of the files (`shared_manifest`), so the time a preemption save
spends on it shrinks with the ranks instead of growing with the model on rank 0 alone. On object storage
(checkpoint.dir=s3://...) reading back is a second transfer of each rank's share over the network.
"""
from __future__ import annotations

import zlib

import torch.distributed as dist

from framework import storage

CHUNK = 4 << 20


def crc32_of(path: str) -> str:
    crc = 0
    with storage.open_read(path) as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _sizes(step_dir: str, skip: tuple[str, ...]) -> dict[str, int]:
    return dict(sorted((rel, size) for rel, size in storage.file_sizes(step_dir).items() if rel not in skip))


def _entries(step_dir: str, sizes: dict[str, int]) -> dict[str, dict]:
    return {rel: {"size": size, "crc32": crc32_of(storage.join(step_dir, rel))} for rel, size in sizes.items()}


def build_manifest(step_dir: str, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """{relative path: {"size": bytes, "crc32": hex}} for every file under step_dir but `skip`."""
    return _entries(step_dir, _sizes(step_dir, skip))


def shares(sizes: dict[str, int], ranks: int) -> list[dict[str, int]]:
    """The files split into `ranks` shares of about equal bytes (largest file to the lightest share)."""
    out, load = [{} for _ in range(ranks)], [0] * ranks
    for rel, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        lightest = load.index(min(load))
        out[lightest][rel] = size
        load[lightest] += size
    return out


def shared_manifest(step_dir: str, skip: tuple[str, ...] = ()) -> dict[str, dict] | None:
    """build_manifest computed by every rank of the process group on its share of the files (a collective:
    every rank calls it). Rank 0 lists the files, so every rank works from one listing even on a shared
    file system whose directory caches lag; rank 0 gets the manifest, the others None."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return build_manifest(step_dir, skip)
    rank, world = dist.get_rank(), dist.get_world_size()
    listing = [_sizes(step_dir, skip) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    mine = _entries(step_dir, shares(listing[0], world)[rank])
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    return dict(sorted(kv for part in gathered for kv in part.items()))


def first_damage(step_dir: str, manifest: dict[str, dict]) -> str | None:
    """What is wrong with the first damaged file, or None when every file matches. Reads, never writes."""
    found = storage.file_sizes(step_dir)
    for rel, expected in manifest.items():
        path = storage.join(step_dir, rel)
        if rel not in found:
            return f"{path} is missing"
        if found[rel] != expected["size"]:
            return f"{path} is damaged: {found[rel]} bytes, {expected['size']} when saved"
    for rel, expected in manifest.items():
        path = storage.join(step_dir, rel)
        if crc32_of(path) != expected["crc32"]:
            return f"{path} is damaged: its checksum differs from the one saved"
    return None
