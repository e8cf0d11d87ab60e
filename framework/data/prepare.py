"""`python -m framework.data.prepare`: documents -> tokenized, sharded dataset dir (see token_dataset.py).

    python -m framework.data.prepare --input corpus/*.jsonl --tokenizer bpe:8192 --out data/corpus

The main process reads documents and writes shards in input order; a pool of worker processes
tokenizes batches of documents (each worker single-threaded, so --workers is the number of cores used).
Everything goes to a hidden sibling dir that is renamed to --out only when complete: an interrupted or
failed run leaves no dataset behind. Bad input exits 2 with one `error: file[:line]: ...` line.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import time
from typing import Iterator

import numpy as np

from framework.data import tokenizer as tokenizers_
from framework.data.documents import DocumentError, all_documents, expand_inputs
from framework.data.token_dataset import DatasetError, ShardWriter, file_sha256, token_dtype

BATCH_CHARS = 1 << 20   # text per task: large enough to amortise the pickling, small enough to stream

_worker_tokenizer = None
_worker_eos = 0
_worker_bos: list[int] = []


def _init_worker(tokenizer_json: str, eos_id: int, bos_ids: list[int]) -> None:
    global _worker_tokenizer, _worker_eos, _worker_bos
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)
    _worker_eos, _worker_bos = eos_id, bos_ids


def encode_documents(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(all ids: each document as the tokenizer begins a text (its BOS, where it has one), then EOS;
    per-document lengths including both)."""
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


def _batches(documents: Iterator[str]) -> Iterator[list[str]]:
    batch, chars = [], 0
    for text in documents:
        batch.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _progress():
    from tqdm import tqdm
    return tqdm(unit="tok", unit_scale=True, desc="prepare", disable=None, dynamic_ncols=True)


def prepare(inputs: list[str], tokenizer_spec: str, out: str, text_key: str = "text",
            shard_tokens: int = 100_000_000, workers: int = 1) -> dict:
    """Write the dataset dir `out`; return its manifest. Raises DocumentError / TokenizerError / DatasetError."""
    if shard_tokens <= 0 or workers <= 0:
        raise DatasetError("--shard-tokens and --workers must be positive")
    if os.path.exists(out):
        raise DatasetError(f"{out} already exists; choose another --out or remove it")
    files = expand_inputs(inputs)
    tok = tokenizers_.build(tokenizer_spec, all_documents(files, text_key))
    eos_token, eos_id = tokenizers_.eos_token(tok)
    bos_ids = tokenizers_.bos_ids(tok)
    vocab = tokenizers_.vocab_size(tok)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        tok.save(os.path.join(tmp, tokenizers_.TOKENIZER_FILE))
        writer = ShardWriter(tmp, token_dtype(vocab), shard_tokens)
        start = time.perf_counter()
        os.environ["TOKENIZERS_PARALLELISM"] = "false"   # before forking: each worker is one core
        with multiprocessing.get_context("fork").Pool(workers, _init_worker, (tok.to_str(), eos_id, bos_ids)) as pool, \
                _progress() as bar:
            for ids, lengths in pool.imap(encode_documents, _batches(all_documents(files, text_key))):
                writer.write_documents(ids, lengths)
                bar.update(len(ids))
        seconds = time.perf_counter() - start
        if writer.tokens == 0:
            raise DocumentError(f"{', '.join(files)}: no documents")
        manifest = writer.finish(
            vocab_size=vocab, eos_id=eos_id, eos_token=eos_token, bos_ids=bos_ids, tokenizer=tokenizers_.TOKENIZER_FILE,
            tokenizer_sha256=file_sha256(os.path.join(tmp, tokenizers_.TOKENIZER_FILE)),
            inputs=[os.path.abspath(p) for p in files], text_key=text_key,
            seconds=round(seconds, 3), tokens_per_sec=round(writer.tokens / max(seconds, 1e-9)))
        os.rename(tmp, out)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.data.prepare",
                                     description="Tokenize text / JSONL / Parquet documents into a sharded dataset dir.")
    parser.add_argument("--input", nargs="+", required=True, help="files, directories or globs")
    parser.add_argument("--text-key", default="text", help="JSONL field / Parquet column holding the text")
    parser.add_argument("--tokenizer", required=True,
                        help="a tokenizer.json, bpe:VOCAB (byte-level BPE trained on the input) or bytes")
    parser.add_argument("--out", required=True, help="the dataset dir to create")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = parser.parse_args(argv)
    try:
        m = prepare(args.input, args.tokenizer, args.out, args.text_key, args.shard_tokens, args.workers)
    except (DocumentError, tokenizers_.TokenizerError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {m['tokens']} tokens, {m['documents']} documents, {len(m['shards'])} shards of "
          f"{m['dtype']}, vocab {m['vocab_size']}, {m['tokens_per_sec'] / args.workers:,.0f} tokens/s per worker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
