"""The size and CRC-32 of every file of a checkpoint, recorded in its meta.json when it is saved and
checked before it is loaded, so a copy cut short or a flipped block is refused before any work. A signed
checkpoint (checkpoint/signing.py) records each file's SHA-256 too, computed in the same read, and is
checked by it instead.

CRC-32 (zlib) reads the files back once after they are written, while they are still in the page
cache; benchmarks/checkpoint_manifest_cost.py measures what that adds to a save. In a job of several
ranks each rank checksums its share of the files (`shared_manifest`), so the time a preemption save
spends on it shrinks with the ranks instead of growing with the model on rank 0 alone. On object storage
(checkpoint.dir=s3://...) reading back is a second transfer of each rank's share over the network.
"""
from __future__ import annotations

import hashlib
import zlib

import torch.distributed as dist

from framework import storage

CHUNK = 4 << 20


def digests_of(path: str, sha256: bool = False) -> dict[str, str]:
    """{"crc32": hex} of a file, and its "sha256" too, in one read."""
    crc, sha = 0, hashlib.sha256() if sha256 else None
    with storage.open_read(path) as f:
        while block := f.read(CHUNK):
            crc = zlib.crc32(block, crc)
            if sha is not None:
                sha.update(block)
    return {"crc32": f"{crc:08x}", **({"sha256": sha.hexdigest()} if sha is not None else {})}


def _sizes(step_dir: str, skip: tuple[str, ...]) -> dict[str, int]:
    return dict(sorted((rel, size) for rel, size in storage.file_sizes(step_dir).items() if rel not in skip))


def _entries(step_dir: str, sizes: dict[str, int], sha256: bool = False) -> dict[str, dict]:
    return {rel: {"size": size, **digests_of(storage.join(step_dir, rel), sha256)} for rel, size in sizes.items()}


def build_manifest(step_dir: str, skip: tuple[str, ...] = (), sha256: bool = False) -> dict[str, dict]:
    """{relative path: {"size": bytes, "crc32": hex[, "sha256": hex]}} for every file under step_dir but `skip`."""
    return _entries(step_dir, _sizes(step_dir, skip), sha256)


def shares(sizes: dict[str, int], ranks: int) -> list[dict[str, int]]:
    """The files split into `ranks` shares of about equal bytes (largest file to the lightest share)."""
    out, load = [{} for _ in range(ranks)], [0] * ranks
    for rel, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        lightest = load.index(min(load))
        out[lightest][rel] = size
        load[lightest] += size
    return out


def shared_manifest(step_dir: str, skip: tuple[str, ...] = (), sha256: bool = False) -> dict[str, dict] | None:
    """build_manifest computed by every rank of the process group on its share of the files (a collective:
    every rank calls it). Rank 0 lists the files, so every rank works from one listing even on a shared
    file system whose directory caches lag; rank 0 gets the manifest, the others None."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return build_manifest(step_dir, skip, sha256)
    rank, world = dist.get_rank(), dist.get_world_size()
    listing = [_sizes(step_dir, skip) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=0)
    mine = _entries(step_dir, shares(listing[0], world)[rank], sha256)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    return dict(sorted(kv for part in gathered for kv in part.items()))


def listing_damage(step_dir: str, manifest: dict[str, dict], signed: bool = False,
                   unlisted: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the files' presence and sizes (signed: also a file the manifest does not list but
    for `unlisted`, or an entry without its SHA-256), or None."""
    found = storage.file_sizes(step_dir)
    for rel, expected in manifest.items():
        path = storage.join(step_dir, rel)
        if rel not in found:
            return f"{path} is missing"
        if found[rel] != expected["size"]:
            return f"{path} is damaged: {found[rel]} bytes, {expected['size']} when saved"
        if signed and "sha256" not in expected:
            return f"{path} has no SHA-256 in the signed manifest"
    extra = sorted(set(found) - set(manifest) - set(unlisted)) if signed else []
    return f"{storage.join(step_dir, extra[0])} is not in the signed manifest" if extra else None


def content_damage(step_dir: str, manifest: dict[str, dict], signed: bool = False) -> str | None:
    """The first file whose CRC-32 (signed: SHA-256) differs from the manifest's, or None. Reads every file."""
    for rel, expected in manifest.items():
        path = storage.join(step_dir, rel)
        try:
            digests = digests_of(path, sha256=signed)
        except FileNotFoundError:
            return f"{path} is missing"
        if signed and digests["sha256"] != expected.get("sha256"):
            return f"{path} is damaged: its SHA-256 differs from the signed one"
        if not signed and digests["crc32"] != expected["crc32"]:
            return f"{path} is damaged: its checksum differs from the one saved"
    return None


def first_damage(step_dir: str, manifest: dict[str, dict], signed: bool = False,
                 unlisted: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the first damaged file, or None when every file matches. Reads, never writes."""
    return listing_damage(step_dir, manifest, signed, unlisted) or content_damage(step_dir, manifest, signed)


def shared_first_damage(step_dir: str, manifest: dict[str, dict], signed: bool = False,
                        unlisted: tuple[str, ...] = ()) -> str | None:
    """first_damage with every rank of the process group reading its share of the files (a collective: every
    rank calls it and every rank gets the answer)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return first_damage(step_dir, manifest, signed, unlisted)
    rank, world = dist.get_rank(), dist.get_world_size()
    found = listing_damage(step_dir, manifest, signed, unlisted) if rank == 0 else None
    if found is None:
        mine = shares({rel: entry["size"] for rel, entry in manifest.items()}, world)[rank]
        found = content_damage(step_dir, {rel: manifest[rel] for rel in manifest if rel in mine}, signed)
    gathered = [None] * world
    dist.all_gather_object(gathered, found)
    return next((g for g in gathered if g is not None), None)
