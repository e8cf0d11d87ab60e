"""`data=datasets`: records through Hugging Face `datasets`: a directory saved with save_to_disk
(load_from_disk), a local dataset directory or data files that load_dataset reads, or a Hub dataset id where
the Hub can be reached; data.split names the split. Prepared into a dataset at launch. `prepare` reads a
saved dataset directory (or a Hub id) as one input through it."""
from __future__ import annotations

import os
import re
import socket
from typing import Iterator
from urllib.parse import urlparse

from framework.data.documents import DocumentError
from framework.data.sources.prepared import PreparedSource
from framework.errors import ConfigError

SAVED = ("state.json", "dataset_info.json", "dataset_dict.json")     # what save_to_disk writes
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
DEFAULT_SPLIT = "train"
REACH_TIMEOUT_S = 3.0


def saved_dir(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name)) for name in SAVED)


def hub_reachable() -> str | None:
    """None if the Hub answers; otherwise why not (offline mode, or no route), in a few seconds at most:
    datasets itself retries for about half a minute before it gives up."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes"):
        return "offline mode is set (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.create_connection((host, 443), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        return f"{host} cannot be reached ({e.strerror or type(e).__name__})"
    return None


def _require_datasets(where: str):
    try:
        import datasets
    except ImportError:
        raise DocumentError(f"{where}: reading it needs the datasets package: pip install 'framework[datasets]'") \
            from None
    return datasets


def load(path: str, split: str = DEFAULT_SPLIT):
    """The split of the dataset at `path` (saved dir, local dataset dir or files, Hub id) as a datasets.Dataset."""
    datasets = _require_datasets(path)
    if saved_dir(path):
        found = datasets.load_from_disk(path)
        if isinstance(found, datasets.DatasetDict):
            if split not in found:
                raise DocumentError(f"{path}: no split {split!r} (splits: {', '.join(found)}); set data.split")
            found = found[split]
        return found
    if not os.path.exists(path):
        if not HUB_ID.fullmatch(path):
            raise DocumentError(f"{path}: no such file or dataset directory")
        reason = hub_reachable()
        if reason is not None:
            raise DocumentError(f"{path}: not a local path, and the Hugging Face Hub is out of reach: {reason}; "
                                f"download the dataset (save_to_disk) and give its directory")
    try:
        return datasets.load_dataset(path, split=split)
    except Exception as e:
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DocumentError(f"{path}: datasets cannot load it ({first})") from None


class Datasets(PreparedSource):
    name = "datasets"
    reads_with = ("Hugging Face datasets are loaded by the package", "datasets", "datasets")
    path_names = "dataset dir, data files or Hub dataset id"

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        if not os.path.exists(data_cfg.path) and not HUB_ID.fullmatch(data_cfg.path):
            raise ConfigError("data.path", f"no such file or dataset directory: {data_cfg.path}")

    def expand(self, inputs: list[str]) -> list[str]:
        return list(inputs)         # the dataset's own loader finds its files

    def reads(self, path: str) -> bool:
        return saved_dir(path)

    def records(self, path: str, columns: list[str] | None = None,
                split: str = DEFAULT_SPLIT) -> Iterator[tuple[str, object]]:
        dataset = load(path, split)
        missing = [c for c in columns or () if c not in dataset.column_names]
        if missing:
            raise DocumentError(f"{path}: no column {missing[0]!r} (columns: {', '.join(dataset.column_names)}); "
                                f"pass --text-key")
        if columns:
            dataset = dataset.select_columns(columns)
        for row, record in enumerate(dataset, 1):
            yield f"{path}[{split}]:row {row}", record
