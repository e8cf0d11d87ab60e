"""Pickles that run a command when they are unpickled, and their planting into copies of real checkpoints
with the manifest rewritten to match (as whoever can write the bucket would): only the unpickler then stands
between the payload and its execution. The command creates a canary file, so a test sees whether it ran."""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata

from framework.checkpoint.manifest import build_manifest


class Runs:
    """An object whose unpickling runs `command` (os.system, pickled as posix.system)."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def touch(canary: Path) -> str:
    return f"touch {canary}"


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data         # BINUNICODE, protocol 1 and up


def _calling(opcodes_for_callable: bytes, argument: str, protocol: int) -> bytes:
    # callable, then (argument,) -> REDUCE
    return bytes([0x80, protocol]) + opcodes_for_callable + _unicode(argument) + b"\x85R."


def global_op(module: str, name: str, argument: str, protocol: int = 2) -> bytes:
    """GLOBAL module name, called with one argument."""
    return _calling(b"c" + module.encode() + b"\n" + name.encode() + b"\n", argument, protocol)


def stack_global_op(module: str, name: str, argument: str, protocol: int = 4) -> bytes:
    """STACK_GLOBAL (protocol 4 and up, where a dotted name is looked up attribute by attribute)."""
    return _calling(_unicode(module) + _unicode(name) + b"\x93", argument, protocol)


def plain_pickles(command: str) -> dict[str, bytes]:
    """Ways a plain pickle (DCP's .metadata) may reach os.system: each protocol, GLOBAL and STACK_GLOBAL, and
    dotted names through modules torch's and DCP's metadata import os into."""
    found = {f"protocol-{p}": pickle.dumps(Runs(command), protocol=p) for p in range(6)}
    found.update({
        "stack-global-torch.os.system": stack_global_op("torch", "os.system", command),
        "stack-global-under-dcp-module": stack_global_op("torch.distributed.checkpoint.filesystem", "os.system",
                                                         command, protocol=5),
        "global-dotted-protocol-4": global_op("torch.distributed.checkpoint.metadata", "os.system", command, 4),
    })
    return found


def torch_file(obj, protocol: int = 2) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=protocol)
    return buffer.getvalue()


def torch_file_with_pickle(data_pkl: bytes) -> bytes:
    """A torch.save zip file whose data.pkl is `data_pkl` (hand-made opcodes)."""
    source = zipfile.ZipFile(io.BytesIO(torch_file({})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for entry in source.namelist():
            target.writestr(entry, data_pkl if entry.endswith("data.pkl") else source.read(entry))
    return out.getvalue()


def torch_files(command: str) -> dict[str, bytes]:
    """Ways a torch.save file (RNG states, DCP entries, DeepSpeed's .pt files) may reach os.system."""
    return {
        "global-protocol-2": torch_file({"state": Runs(command)}),
        "stack-global-protocol-4": torch_file({"state": Runs(command)}, protocol=4),
        "dotted-torch.os.system": torch_file_with_pickle(global_op("torch", "os.system", command, 4)),
        "stack-global-dotted": torch_file_with_pickle(stack_global_op("torch", "os.system", command)),
    }


# ---- planting into a DCP step dir --------------------------------------------------------------------------

def read_metadata(state_dir: Path):
    """DCP's metadata of a checkpoint the test itself trained (trusted: plain pickle)."""
    with open(state_dir / ".metadata", "rb") as f:
        return pickle.load(f)


def entries(state_dir: Path, kind) -> list[str]:
    """The entries of a state dir whose metadata is of `kind` (BytesStorageMetadata, TensorStorageMetadata)."""
    return sorted(fqn for fqn, meta in read_metadata(state_dir).state_dict_metadata.items() if isinstance(meta, kind))


def plant_entry(state_dir: Path, fqn: str, data: bytes) -> Path:
    """Point the entry `fqn` (its first chunk) at `data`, appended to the file that held it; return that file."""
    metadata = read_metadata(state_dir)
    entry = metadata.state_dict_metadata[fqn]
    index = MetadataIndex(fqn, entry.chunks[0].offsets if isinstance(entry, TensorStorageMetadata) else None)
    info = metadata.storage_data[index]
    target = state_dir / info.relative_path
    offset = target.stat().st_size
    with open(target, "ab") as f:
        f.write(data)
    info.offset, info.length = offset, len(data)
    if hasattr(info, "transform_descriptors"):
        info.transform_descriptors = None
    with open(state_dir / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return target


def byte_entries(state_dir: Path) -> list[str]:
    return entries(state_dir, BytesStorageMetadata)


def tensor_entries(state_dir: Path) -> list[str]:
    return entries(state_dir, TensorStorageMetadata)


def rewrite_manifest(step_dir: Path) -> None:
    """meta.json's sizes and CRC-32s made to match the files as they are now (meta.json left unsigned)."""
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["files"] = build_manifest(str(step_dir), skip=("meta.json",))
    meta.pop("signature", None)
    (step_dir / "meta.json").write_text(json.dumps(meta))


# ---- CRC-32 forging ---------------------------------------------------------------------------------------

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0xEDB88320 if _c & 1 else _c >> 1
    _TABLE.append(_c)
_BY_TOP_BYTE = {c >> 24: i for i, c in enumerate(_TABLE)}


def flip_keeping_crc(data: bytes, position: int) -> bytes:
    """`data` with the byte at `position` changed and the four after it chosen so that its CRC-32 (and size)
    stay the same: CRC-32 is linear, so four free bytes reach any value."""
    changed = bytearray(data)
    changed[position] ^= 0xFF
    start, end = position + 1, position + 5
    state = zlib.crc32(bytes(changed[:start])) ^ 0xFFFFFFFF          # the register before the free bytes
    wanted = zlib.crc32(data[:end]) ^ 0xFFFFFFFF                      # the register the original had after them
    indices, register = [], wanted
    for _ in range(4):
        index = _BY_TOP_BYTE[register >> 24]
        indices.append(index)
        register = ((register ^ _TABLE[index]) << 8) & 0xFFFFFFFF
    for offset, index in enumerate(reversed(indices)):
        changed[start + offset] = (state ^ index) & 0xFF
        state = (state >> 8) ^ _TABLE[index]
    assert zlib.crc32(bytes(changed)) == zlib.crc32(data) and changed != bytearray(data)
    return bytes(changed)
