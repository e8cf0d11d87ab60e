"""Sources whose records are tokenized at launch (jsonl, parquet, datasets, chat): before validation the
launching process prepares the inputs once (framework/data/prepare.py) into a dataset dir named by what went
in -- the inputs' paths, sizes and modification times, the tokenizer and the options -- under data.cache_dir,
and data.prepared points at it. A later run with the same inputs reuses it; training then reads its
memory-mapped shards as data=tokens does. Bad input is a configuration error naming the file and line, and
leaves no dataset behind."""
from __future__ import annotations

import hashlib
import json
import os
import sys

from framework.data import token_dataset
from framework.data.documents import DocumentError, expand_inputs
from framework.data.sources.base import DataError, Source, Stream, open_path
from framework.errors import ConfigError

CACHE_VERSION = 1


def default_cache_dir() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "framework", "prepared")


def _input_stats(path: str) -> list:
    """What says a file (every file under a directory) changed: its path, size and modification time."""
    if not os.path.exists(path):
        return [path]          # a Hub dataset id
    files = [path] if os.path.isfile(path) else sorted(os.path.join(r, n) for r, _, ns in os.walk(path) for n in ns)
    return [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]


def _tokenizer_digest(spec: str) -> str:
    if not os.path.exists(spec):
        return spec             # bytes, bpe:N
    folder = spec if os.path.isdir(spec) else os.path.dirname(os.path.abspath(spec))
    names = [os.path.join(folder, n) for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")]
    digest = hashlib.sha256()
    for name in [spec] * os.path.isfile(spec) + names:
        if os.path.isfile(name):
            digest.update(token_dataset.file_sha256(name).encode())
    return digest.hexdigest()


class PreparedSource(Source):
    path_names = "file"
    vocab_from_data = True
    #: only chat records (True), or text documents or chat records as the first record says (False)
    chat_only = False
    #: preference records (prompt, chosen, rejected), each written as two examples (framework/data/pairs.py)
    pairs = False

    def expand(self, inputs: list[str]) -> list[str]:
        """The inputs prepare reads (files, directories and globs expanded)."""
        return expand_inputs(inputs)

    def check(self, data_cfg) -> None:
        super().check(data_cfg)
        if not data_cfg.tokenizer:
            raise ConfigError("data.tokenizer", f"is required for data.source={self.name}: a tokenizer.json, a "
                                                f"Hugging Face tokenizer dir, bpe:VOCAB or bytes")
        try:
            self.expand([data_cfg.path])
        except DocumentError as e:
            raise ConfigError("data.path", str(e)) from None
        self.check_template(data_cfg)

    def check_template(self, data_cfg) -> None:
        """The chat template that will render the records, where it is known before they are read (data.chat_template
        named, or chat data: the tokenizer's own) needs transformers: say so here, not in a tokenizing worker."""
        from framework.data.chat import MissingRenderer, check_renderer, choose_template
        from framework.data.tokenizer import parse_spec
        if not (self.chat_only or data_cfg.chat_template):
            return
        own = parse_spec(data_cfg.tokenizer)[0] == "file"
        try:
            check_renderer(choose_template(data_cfg.chat_template, data_cfg.tokenizer, own))
        except MissingRenderer as e:
            raise ConfigError(f"data.{e.option}", str(e)) from None

    def fingerprint(self, data_cfg) -> str:
        inputs = self.expand([data_cfg.path])
        what = {"version": CACHE_VERSION, "format": token_dataset.VERSION, "source": self.name,
                "inputs": [_input_stats(p) for p in inputs], "tokenizer": _tokenizer_digest(data_cfg.tokenizer),
                "text_key": data_cfg.text_key, "chat_template": data_cfg.chat_template, "train_on": data_cfg.train_on,
                "split": data_cfg.split}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def resolve(self, data_cfg) -> None:
        """Prepare the inputs (or find them prepared) and point data.prepared at the dataset dir."""
        from framework.data.chat import MissingRenderer
        from framework.data.prepare import ChatOptions, PrepareFailed, prepare
        from framework.data.tokenizer import TokenizerError
        self.check(data_cfg)
        name = os.path.basename(os.path.normpath(data_cfg.path)).split(".")[0] or self.name
        out = os.path.join(data_cfg.cache_dir or default_cache_dir(), f"{name}-{self.fingerprint(data_cfg)}")
        if not os.path.isfile(os.path.join(out, token_dataset.MANIFEST)):
            try:
                manifest = prepare([data_cfg.path], data_cfg.tokenizer, out, data_cfg.text_key,
                                   workers=max(1, min(8, (os.cpu_count() or 2) - 1)),
                                   chat=ChatOptions(data_cfg.chat_template, data_cfg.train_on), source=self,
                                   split=data_cfg.split, chat_only=self.chat_only, pairs=self.pairs)
                kind = ("pairs" if self.pairs else "conversations" if manifest.get("loss_mask") else "documents")
                count = manifest["documents"] // 2 if self.pairs else manifest["documents"]
                print(f"prepared {data_cfg.path} into {out}: {manifest['tokens']} tokens, {count} {kind}",
                      file=sys.stderr)
            except MissingRenderer as e:    # the tokenizer's own template, found on reading chat records
                raise ConfigError(f"data.{e.option}", str(e)) from None
            except (DocumentError, TokenizerError) as e:
                raise ConfigError("data.path" if isinstance(e, DocumentError) else "data.tokenizer", str(e)) from None
            except PrepareFailed as e:     # not the data's fault: exit 1, still in one line
                raise SystemExit(f"error: data.path: {data_cfg.path}: {e}") from None
            except token_dataset.DatasetError:
                # another process (a torchrun rank) renamed the same dataset into place first
                if not os.path.isfile(os.path.join(out, token_dataset.MANIFEST)):
                    raise
        data_cfg.prepared = out

    def dataset_dirs(self, data_cfg) -> list[tuple[str, str]]:
        return [("data.path", data_cfg.prepared)] if data_cfg.prepared else []

    def streams(self, data_cfg) -> list[Stream]:
        if not data_cfg.prepared:
            raise DataError(f"data.path: {data_cfg.path} is not prepared yet (the launcher prepares it)")
        stream = open_path(data_cfg.prepared, data_cfg)
        stream.name = data_cfg.path
        return [stream]
