"""torch.distributed.checkpoint's reading, with nothing of the checkpoint unpickled but through
checkpoint/unpickle.py.

DCP reads three kinds of pickle: its `.metadata` (plain pickle.load), each tensor (torch.load, weights only)
and each non-tensor entry (optimizer hyper-parameters: torch.load with weights_only=False, in
DefaultLoadPlanner.load_bytes). Here the reader's `read_metadata` parses `.metadata` once with the exact
allowlist and keeps what it parsed, so the bytes checked are the bytes used (no check, then a second read);
`read_data` reads the tensors file by file, weights only, with the exact tensor classes the state being loaded
holds besides plain tensors (a QLoRA base's NF4Tensor: what the checkpoint of such a model holds too), so a
refusal names its file; and the planner's `load_bytes` reads the non-tensor entries weights only. Every
dcp.load of the package goes through `reader` and RestrictedLoadPlanner.
"""
from __future__ import annotations

import dataclasses
import functools
import pickle

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, Metadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.futures import Future

from framework import storage
from framework.checkpoint.unpickle import UnsafeCheckpointError, load_pickle, load_torch, weights_only_refusal

METADATA = ".metadata"   # the file DCP writes its metadata to, in the state dir


class _Restricted:
    """What the restricted readers share; `where` is the state dir as the user named it (path or URL)."""

    def __init__(self, path: str):
        super().__init__(path)
        self.where = path
        self._metadata = None

    def read_metadata(self) -> Metadata:
        """Without DCP's `rank` keyword: DCP then never falls back to a rank's own metadata file."""
        if self._metadata is None:
            where = storage.join(self.where, METADATA)
            metadata = load_pickle(storage.read_bytes(where), where)
            if not isinstance(metadata, Metadata):
                raise UnsafeCheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP's metadata")
            self._metadata = metadata
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner) -> Future:
        files: dict[str, list] = {}
        for item in plan.items:
            files.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        classes = planner.tensor_classes() if isinstance(planner, RestrictedLoadPlanner) else []
        for relative_path, items in files.items():
            where = storage.join(self.where, relative_path)
            try:
                with torch.serialization.safe_globals(classes):
                    super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except pickle.UnpicklingError as e:      # a tensor: torch's weights-only load refused it
                raise UnsafeCheckpointError(f"{where}: {weights_only_refusal(str(e))}") from None
            except UnsafeCheckpointError as e:       # a non-tensor entry: the planner refused it
                raise UnsafeCheckpointError(f"{where}: {e}") from None
        done: Future = Future()
        done.set_result(None)
        return done


class RestrictedFileSystemReader(_Restricted, FileSystemReader):
    pass


@functools.cache
def _restricted_fsspec_reader() -> type:
    # DCP's fsspec reader has no public home in torch; it is the one DCP itself picks for a URL
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    return type("RestrictedFsspecReader", (_Restricted, FsspecReader), {})


def reader(path: str):
    """DCP's reader for a state dir at a path or a URL (fsspec), restricted as the module says."""
    return (_restricted_fsspec_reader() if storage.is_url(path) else RestrictedFileSystemReader)(path)


class RestrictedLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner, reading each non-tensor entry weights only (torch's own reads it with
    weights_only=False)."""

    def tensor_classes(self) -> list[type]:
        """The classes of the state's tensors other than plain tensors and parameters: the exact classes its
        entries may be pickled as (set up by DCP before any read)."""
        plain = (torch.Tensor, torch.nn.Parameter)
        return sorted({type(t) for t in self.state_dict.values() if torch.is_tensor(t) and type(t) not in plain},
                      key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")

    def load_bytes(self, read_item, value) -> None:
        fqn = read_item.dest_index.fqn
        loaded = load_torch(value.getvalue(), f"entry {fqn}")
        if not self.flatten_state_dict:
            self.state_dict[fqn] = loaded
            return
        *parents, last = self.mappings[fqn]
        container = self.original_state_dict
        for key in parents:
            container = container[key]
        container[last] = loaded


def check_metadata(state_dir: str) -> None:
    """Refuse (UnsafeCheckpointError) a DCP state dir whose `.metadata` names anything but DCP's metadata."""
    reader(state_dir).read_metadata()


def first_failure(e: CheckpointException) -> BaseException:
    """The exception a rank's read ran into, out of DCP's wrapper of every rank's failures."""
    return next(iter(e.failures.values()))[0]
