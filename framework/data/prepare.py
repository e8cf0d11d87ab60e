"""`python -m framework.data.prepare`: documents -> tokenized, sharded dataset dir (see token_dataset.py).

    python -m framework.data.prepare --input corpus/*.jsonl --tokenizer bpe:8192 --out data/corpus

The main process reads documents and writes shards in input order; a pool of worker processes
tokenizes batches of documents (each worker single-threaded, so --workers is the number of cores used).
Everything goes to a hidden sibling dir that is renamed to --out only when complete: an interrupted or
failed run leaves no dataset behind. Bad input exits 2 with one `error: file[:line]: ...` line.

What the workers need (transformers, for a chat template) is checked here before the pool starts. A worker
that cannot start or dies stops the run in one line: its initializer keeps what it raised and the first task
raises it (multiprocessing.Pool restarts a worker whose initializer fails, forever), and a dead worker breaks
the pool (concurrent.futures), which ends the run instead of waiting on a task that never returns.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from framework.data import tokenizer as tokenizers_
from framework.data.chat import (TEMPLATES, TRAIN_ON, ChatError, Example, MissingRenderer, Renderer, Template,
                                 check_renderer, choose_template, contents, example_of, fit_tokenizer, is_chat_record,
                                 stop_tokens)
from framework.data.documents import DocumentError, expand_inputs, read_records, text_of
from framework.data.pairs import contents as pair_contents
from framework.data.pairs import encode_pair, is_pair_record, pair_of
from framework.data.token_dataset import DatasetError, ShardWriter, file_sha256, token_dtype

BATCH_CHARS = 1 << 20   # text per task: large enough to amortise the pickling, small enough to stream

_worker_tokenizer = None
_worker_eos = 0
_worker_bos: list[int] = []
_worker_renderer = None
_worker_train_on = "assistant"
_worker_failure: BaseException | None = None


class PrepareFailed(RuntimeError):
    """A tokenizing worker could not start, failed outside the data's checks, or died: not the input's fault."""


WORKER_DIED = "a tokenizing worker process died (killed, or out of memory?)"


def _init_worker(tokenizer_json: str, template, bos_ids: list[int], eos_id: int, train_on) -> None:
    global _worker_tokenizer, _worker_eos, _worker_bos, _worker_renderer, _worker_train_on, _worker_failure
    try:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from tokenizers import Tokenizer
        _worker_tokenizer = Tokenizer.from_str(tokenizer_json)
        _worker_eos, _worker_bos, _worker_train_on = eos_id, bos_ids, train_on
        _worker_renderer = Renderer(tokenizer_json, template, bos_ids, eos_id) if template is not None else None
    except Exception as e:      # raised by this worker's first task: see the module's docstring
        _worker_failure = e


def _started() -> None:
    if _worker_failure is not None:
        raise _worker_failure


def encode_documents(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(all ids: each document as the tokenizer begins a text (its BOS, where it has one), then EOS;
    per-document lengths including both)."""
    _started()
    encoded = _worker_tokenizer.encode_batch(texts, add_special_tokens=False)
    bos = len(_worker_bos)
    lengths = np.fromiter((bos + len(e.ids) + 1 for e in encoded), dtype=np.int64, count=len(encoded))
    ids = np.empty(int(lengths.sum()), dtype=np.uint32)
    ends = np.cumsum(lengths)
    for e, end, length in zip(encoded, ends, lengths):
        ids[end - length:end - length + bos] = _worker_bos
        ids[end - length + bos:end - 1] = e.ids
    ids[ends - 1] = _worker_eos
    return ids, lengths


def encode_examples(examples: list[Example]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all ids, per-example lengths, the loss mask over all ids)."""
    _started()
    encoded = [_worker_renderer.encode(e, _worker_train_on) for e in examples]
    lengths = np.fromiter((len(ids) for ids, _ in encoded), dtype=np.int64, count=len(encoded))
    return (np.concatenate([ids for ids, _ in encoded]), lengths, np.concatenate([mask for _, mask in encoded]))


def encode_pairs(pairs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all ids, per-example lengths, the completion mask over all ids): each pair two examples, chosen then
    rejected (framework/data/pairs.py)."""
    _started()
    ids, masks = [], []
    for pair in pairs:
        found = encode_pair(pair, _worker_renderer)
        ids += found[0]
        masks += found[1]
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    return np.concatenate(ids), lengths, np.concatenate(masks)


def _in_order(pool: ProcessPoolExecutor, work, items, ahead: int):
    """pool.map(work, items) with at most `ahead` tasks queued (the items stream: a corpus need not fit in
    memory); the first task that raises ends it, as does a worker that dies."""
    pending: deque = deque()
    try:
        for item in items:
            pending.append(_submitted(pool, work, item))
            if len(pending) >= ahead:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        for future in pending:
            future.cancel()


def _submitted(pool: ProcessPoolExecutor, work, item):
    try:
        return pool.submit(work, item)
    except BrokenProcessPool:
        raise PrepareFailed(WORKER_DIED) from None


def _result(future):
    """A task's result; what the data is blamed for (a record, the tokenizer) as raised, anything else as
    PrepareFailed."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise PrepareFailed(WORKER_DIED) from None
    except (DocumentError, tokenizers_.TokenizerError, DatasetError):
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise PrepareFailed(f"a tokenizing worker failed: {type(e).__name__}: {first}") from None


def _batches(items: Iterator, size=len) -> Iterator[list]:
    batch, chars = [], 0
    for item in items:
        batch.append(item)
        chars += size(item)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _progress():
    from tqdm import tqdm
    return tqdm(unit="tok", unit_scale=True, desc="prepare", disable=None, dynamic_ncols=True)


@dataclass(frozen=True)
class ChatOptions:
    """How chat records become examples: data.chat_template (None: the tokenizer's own) and data.train_on."""
    template: Optional[str] = None
    train_on: str = "assistant"


def _first_record(files: list[str], read) -> tuple[str, object] | None:
    for path in files:
        for found in read(path, None):
            return found
    return None


def _examples(files: list[str], read, text_key: str, template: Template) -> Iterator[Example]:
    for where, record in all_records_of(files, read):
        if not is_chat_record(record, text_key):
            raise ChatError(f"{where}: not a chat record: give 'messages' (a list of {{role, content}}) or "
                            f"'prompt' and 'completion'")
        example = example_of(where, record, text_key)
        if example.messages is not None and template.jinja is None:
            raise ChatError(f"{where}: a conversation needs a chat template, and the tokenizer has none; name a "
                            f"built-in one: {' or '.join(TEMPLATES)} (data.chat_template / --chat-template)")
        yield example


def _pairs(files: list[str], read) -> Iterator:
    for where, record in all_records_of(files, read):
        yield pair_of(where, record)


def all_records_of(files: list[str], read, columns: list[str] | None = None):
    for path in files:
        yield from read(path, columns)


def prepare(inputs: list[str], tokenizer_spec: str, out: str, text_key: str = "text",
            shard_tokens: int = 100_000_000, workers: int = 1, chat: Optional[ChatOptions] = None,
            source=None, split: str = "train", chat_only: bool = False, pairs: bool = False) -> dict:
    """Write the dataset dir `out`; return its manifest. Raises DocumentError / TokenizerError / DatasetError.

    The inputs are read by `source` (a data Source), or each by the source that reads its kind. They are chat
    records when the first one is a conversation (then every one must be; `chat_only`: they must be), else
    text documents; `pairs`: they are preference records (framework/data/pairs.py), each written as two examples,
    chosen then rejected, the completion trained."""
    if shard_tokens <= 0 or workers <= 0:
        raise DatasetError("--shard-tokens and --workers must be positive")
    if os.path.exists(out):
        raise DatasetError(f"{out} already exists; choose another --out or remove it")
    chat = chat or ChatOptions()
    if chat.train_on not in TRAIN_ON:
        raise DatasetError(f"--train-on {chat.train_on}: use one of {', '.join(TRAIN_ON)}")
    files = source.expand(inputs) if source is not None else expand_inputs(inputs)

    def read(path, columns):
        return read_records(path, columns, source, split)

    first = _first_record(files, read)
    is_chat = first is not None and is_chat_record(first[1], text_key)
    if chat_only and not pairs and first is not None and not is_chat:
        raise ChatError(f"{first[0]}: not a chat record: give 'messages' (a list of {{role, content}}) or 'prompt' "
                        f"and 'completion'")
    kind, _ = tokenizers_.parse_spec(tokenizer_spec)
    if pairs:
        if first is not None and not is_pair_record(first[1]):
            raise ChatError(f"{first[0]}: not a preference record: give 'prompt', 'chosen' and 'rejected'")
        is_chat = True          # examples with a loss mask, and the template's files beside the tokenizer
        template = choose_template(chat.template, tokenizer_spec, own=kind == "file")
        check_renderer(template)
        training = (text for pair in _pairs(files, read) for text in pair_contents(pair))
    elif is_chat:
        template = choose_template(chat.template, tokenizer_spec, own=kind == "file")
        check_renderer(template)
        training = (text for e in _examples(files, read, text_key, template) for text in contents(e))
    else:
        template = None
        training = (text_of(w, r, text_key) for w, r in all_records_of(files, read, [text_key]))
    tok = tokenizers_.build(tokenizer_spec, training if kind == "bpe" else None)
    if template is not None:
        fit_tokenizer(tok, template, tokenizer_spec, ours=kind != "file")
    eos_token, eos_id = tokenizers_.eos_token(tok)
    bos_ids = tokenizers_.bos_ids(tok)
    vocab = tokenizers_.vocab_size(tok)
    parent = os.path.dirname(os.path.abspath(out))
    made_parent = not os.path.isdir(parent)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    done = False
    try:
        if pairs:
            tokenizers_.write_hf_files(tok, tmp, chat_template=template.jinja, bos_token=template.bos_token)
            work, init = encode_pairs, (tok.to_str(), template, bos_ids, eos_id, chat.train_on)
            items = _batches(_pairs(files, read), size=lambda p: sum(map(len, pair_contents(p))))
        elif is_chat:
            tokenizers_.write_hf_files(tok, tmp, chat_template=template.jinja, bos_token=template.bos_token)
            work, init = encode_examples, (tok.to_str(), template, bos_ids, eos_id, chat.train_on)
            items = _batches(_examples(files, read, text_key, template), size=lambda e: sum(map(len, contents(e))))
        else:
            tok.save(os.path.join(tmp, tokenizers_.TOKENIZER_FILE))
            work, init = encode_documents, (tok.to_str(), None, bos_ids, eos_id, None)
            items = _batches(text_of(w, r, text_key) for w, r in all_records_of(files, read, [text_key]))
        writer = ShardWriter(tmp, token_dtype(vocab), shard_tokens, loss_mask=is_chat)
        start = time.perf_counter()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"   # before forking: each worker is one core
        with ProcessPoolExecutor(workers, multiprocessing.get_context("fork"), _init_worker, init) as pool, \
                _progress() as bar:
            for encoded in _in_order(pool, work, items, ahead=2 * workers):
                writer.write_documents(*encoded)
                bar.update(len(encoded[0]))
        seconds = time.perf_counter() - start
        if writer.tokens == 0:
            raise DocumentError(f"{', '.join(files)}: no documents")
        extra = {}
        if is_chat:
            extra = {"chat_template": template.name, "train_on": chat.train_on,
                     "stop_tokens": stop_tokens(tok, template, eos_token)}
        if pairs:
            extra.update(pairs=True, train_on="completion")
        manifest = writer.finish(
            vocab_size=vocab, eos_id=eos_id, eos_token=eos_token, bos_ids=bos_ids, tokenizer=tokenizers_.TOKENIZER_FILE,
            tokenizer_sha256=file_sha256(os.path.join(tmp, tokenizers_.TOKENIZER_FILE)),
            inputs=[os.path.abspath(p) if os.path.exists(p) else p for p in files], text_key=text_key, **extra,
            seconds=round(seconds, 3), tokens_per_sec=round(writer.tokens / max(seconds, 1e-9)))
        os.rename(tmp, out)
        done = True
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if made_parent and not done and not os.listdir(parent):
            os.rmdir(parent)      # a failed run leaves the directory tree as it found it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.data.prepare",
                                     description="Tokenize text / JSONL / Parquet / HF datasets documents, or chat records, "
                                                 "into a sharded dataset dir.")
    parser.add_argument("--input", nargs="+", required=True, help="files, directories or globs")
    parser.add_argument("--text-key", default="text", help="JSONL field / Parquet column holding the text")
    parser.add_argument("--tokenizer", required=True,
                        help="a tokenizer.json (or an HF tokenizer dir), bpe:VOCAB (byte-level BPE trained on the "
                             "input) or bytes")
    parser.add_argument("--out", required=True, help="the dataset dir to create")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--chat-template", choices=list(TEMPLATES), default=None,
                        help="chat records: a built-in template (default: the tokenizer's own)")
    parser.add_argument("--train-on", choices=list(TRAIN_ON), default="assistant",
                        help="chat records: which tokens are trained (the others are masked from the loss)")
    parser.add_argument("--split", default="train", help="a saved or Hub dataset's split")
    args = parser.parse_args(argv)
    try:
        m = prepare(args.input, args.tokenizer, args.out, args.text_key, args.shard_tokens, args.workers,
                    ChatOptions(args.chat_template, args.train_on), split=args.split)
    except MissingRenderer as e:
        given = (f"--chat-template {args.chat_template}" if e.option == "chat_template"
                 else f"--tokenizer {args.tokenizer}")
        print(f"error: {given}: {e}", file=sys.stderr)
        return 2
    except (DocumentError, tokenizers_.TokenizerError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PrepareFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    kind = f"{m['documents']} {'conversations' if m.get('loss_mask') else 'documents'}"
    print(f"wrote {args.out}: {m['tokens']} tokens, {kind}, {len(m['shards'])} shards of "
          f"{m['dtype']}, vocab {m['vocab_size']}, {m['tokens_per_sec'] / args.workers:,.0f} tokens/s per worker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
