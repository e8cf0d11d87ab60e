"""Every pickle a checkpoint holds is read here, and nothing in one runs code.

A pickle names the functions and classes it calls to rebuild its objects; an unpickler that imports what
it is told runs whatever a crafted file asks for (`os.system`, reached as `torch.os.system` too). Two readers
admit exact names only and refuse everything else with UnsafeCheckpointError, one line naming the file
and the refused name:

- `load_pickle`, for plain pickles (DCP's `.metadata`): a pickle.Unpickler whose find_class admits the exact
  (module, name) pairs of METADATA_GLOBALS - what the metadata of every strategy, precision and LoRA base
  dtype holds - resolves no dotted name and imports nothing else. Every opcode that names a global reaches
  find_class in CPython's unpickler (GLOBAL, STACK_GLOBAL, INST, OBJ and the EXT codes of copyreg's
  registry, protocols 0-5), so the only callables a pickle can reach - what REDUCE, NEWOBJ and BUILD call -
  are those listed; a persistent id is refused.
- `load_torch`, for torch.save files (RNG states, DeepSpeed's `.pt` files, DCP's non-tensor entries):
  torch.load(weights_only=True) with exact extra classes (torch.serialization.safe_globals). Verified in
  torch 2.13's torch/_weights_only_unpickler.py: a GLOBAL is looked up as the string "module.name" in dicts
  of allowed objects - torch's tensor rebuilders, storages, dtypes, and what safe_globals adds, keyed by
  "cls.__module__.cls.__qualname__" - and never imported or resolved by getattr, so a dotted name matches
  nothing unless that exact string is listed; sys, os, posix and nt are refused even when listed;
  STACK_GLOBAL and every opcode outside its table are refused; REDUCE and NEWOBJ call only allowed
  objects, BUILD sets state only on allowed types, and a persistent id may only name a storage.
  Libraries add their own tensor classes to that process-wide list as they are imported
  (torch.distributed.tensor's DTensor, torchao's NF4Tensor and Float8Tensor), classes made to be loaded so.
- `torch_loads_restricted`: around library code that calls torch.load(weights_only=False) itself (DeepSpeed's
  engine and its zero_to_fp32), torch's documented switch TORCH_FORCE_WEIGHTS_ONLY_LOAD, read by every
  torch.load, makes each of those calls a weights-only one.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from typing import Iterable

import torch


class UnsafeCheckpointError(ValueError):
    """A checkpoint file that asks for something a checkpoint never holds, or cannot be read; one line."""


NOT_OURS = "no checkpoint of this framework holds it, so the file was altered or written by something else"

# The metadata DCP pickles, as real checkpoints of every strategy (single, ddp, zero1, fsdp, 3d with tp and
# pp, deepspeed aside), precision (fp32, bf16, fp16, float8), LoRA base dtype (bf16, float8, nf4) and
# async saves name it: its dataclasses, the storage index of its file system writer, torch.Size, the layout
# lookup and the dtypes of the tensors; a local path as checkpoint_id.
METADATA_GLOBALS = frozenset({
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    *(("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)),
})


class _Refused(Exception):
    pass


def _resolve(module: str, name: str):
    return getattr(importlib.import_module(module), name)


class _ExactUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed: frozenset):
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str):
        if "." in name or (module, name) not in self._allowed:
            raise _Refused(f"{module}.{name}")
        return _resolve(module, name)

    def persistent_load(self, pid):
        raise _Refused("a persistent id")


def load_pickle(data: bytes, where: str, allowed: frozenset = METADATA_GLOBALS):
    """The object a plain pickle holds, if it names only `allowed` (module, name) pairs."""
    try:
        return _ExactUnpickler(io.BytesIO(data), allowed).load()
    except _Refused as e:
        raise UnsafeCheckpointError(f"{where}: refuses to unpickle {e}; {NOT_OURS}") from None
    except Exception as e:
        raise UnsafeCheckpointError(f"{where}: unreadable checkpoint metadata ({type(e).__name__})") from None


def _classes(names: Iterable) -> list:
    """Classes, given as themselves or as "module.name" strings (resolved here, exactly)."""
    return [_resolve(*name.rsplit(".", 1)) if isinstance(name, str) else name for name in names]


def load_torch(source, where: str, extra: Iterable = (), map_location="cpu", mmap: bool = False):
    """torch.load of a file (a path) or bytes, weights only, with the exact `extra` classes (or their
    "module.name" strings) besides torch's own. mmap: map a zip file's tensors instead of reading them
    (a check of what the file names that leaves its tensors on disk)."""
    extra = _classes(extra)
    file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        with torch.serialization.safe_globals(extra), warnings.catch_warnings():
            # it warns of a protocol other than torch.save's before refusing what that protocol adds
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(file, map_location=map_location, weights_only=True,
                              mmap=mmap and not isinstance(file, io.BytesIO) and zipfile.is_zipfile(file))
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(f"{where}: {weights_only_refusal(str(e), source)}") from None
    except Exception as e:
        raise UnsafeCheckpointError(f"{where}: unreadable ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0] if str(e) else ''})") from None


@contextlib.contextmanager
def torch_loads_restricted(extra: Iterable[str] = ()):
    """Every torch.load in this process is weights-only while inside (with the exact `extra` classes), whatever
    weights_only its caller passes: for library code that loads a checkpoint's files itself. Not thread-safe
    against other threads' torch.load calls, which it restricts too."""
    names = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    before = {name: os.environ.get(name) for name in names}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    try:
        with torch.serialization.safe_globals(_classes(extra)):
            yield
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(f"a checkpoint file read by a library: {weights_only_refusal(str(e))}") \
            from None
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def weights_only_refusal(message: str, source=None) -> str:
    """What torch's weights-only unpickler refused, in a few words, from its message (and the file's opcodes)."""
    named = re.search(r"GLOBAL (\S+)", message)
    if named:
        return f"refuses to unpickle {named.group(1)}; {NOT_OURS}"
    opcode = re.search(r"Unsupported operand (\d+)", message)
    if opcode:
        code = int(opcode.group(1))
        op = next((o.name for o in pickletools.opcodes if o.code == chr(code)), None)
        if op is None:
            return "unreadable (not a pickle torch.save wrote)"
        foreign = [f"{module}.{name}" for module, name in _globals_named(source)
                   if module.split(".")[0] not in ("torch", "collections") or "." in name]
        return (f"refuses pickle opcode {op}" + (f" in a file that names {', '.join(foreign[:3])}" if foreign else "")
                + f"; {NOT_OURS}")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next((line.split("WeightsUnpickler error: ", 1)[1] for line in lines
                   if "WeightsUnpickler error: " in line), lines[-1] if lines else "")
    return f"refuses to load ({detail}); {NOT_OURS}"


def _globals_named(source) -> list[tuple[str, str]]:
    """(module, name) of every global a torch zip file's pickles name, in order (for an error message only:
    reads the opcodes, runs nothing; [] where it cannot tell)."""
    if source is None:
        return []
    names = []
    try:
        file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else open(source, "rb")
        with file, zipfile.ZipFile(file) as archive:
            for entry in (e for e in archive.namelist() if e.endswith(".pkl")):
                pushed, memo = [None, None], {}     # what each opcode pushed, where it was a string
                for op, arg, _ in pickletools.genops(archive.read(entry)):
                    if op.name in ("GLOBAL", "INST"):
                        names.append(tuple(arg.split(" ", 1)))
                    elif op.name == "STACK_GLOBAL":
                        module, name = pushed[-2:]
                        names.append((module, name) if isinstance(module, str) and isinstance(name, str) else ("?", "?"))
                    elif op.name == "MEMOIZE":
                        memo[len(memo)] = pushed[-1]
                    elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                        memo[arg] = pushed[-1]
                    elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                        pushed.append(memo.get(arg))
                    elif op.stack_after:
                        pushed.append(arg if isinstance(arg, str) and "UNICODE" in op.name else None)
    except Exception:
        pass
    return list(dict.fromkeys(names))
