"""`python -m framework.data.prepare`: documents of every format in, a complete dataset dir or nothing out."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from framework.data import prepare as prepare_module
from framework.data.prepare import prepare
from framework.data.token_dataset import ShardedTokens, open_tokens, read_manifest
from framework.data.tokenizer import EOS_TOKEN
from tests.harness.helpers import run_framework

DOCS = ["first document", "second one, ünïcode", "third"]


def _prepare_cli(*args):
    return run_framework(list(args), module="framework.data.prepare")


def _decode_documents(out) -> list[list[int]]:
    tokens = np.asarray(open_tokens(str(out)))
    starts = np.load(out / "documents.npy")
    return [tokens[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]


def test_text_jsonl_and_parquet_become_documents_with_eos_after_each(tmp_path):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text(DOCS[0])
    (tmp_path / "in" / "sub" / "b.jsonl").write_text(json.dumps({"body": DOCS[1]}) + "\n\n")
    pq.write_table(pa.table({"body": [DOCS[2]]}), tmp_path / "in" / "sub" / "c.parquet")
    out = tmp_path / "out"
    manifest = prepare([str(tmp_path / "in")], "bytes", str(out), text_key="body", shard_tokens=7, workers=2)
    eos = manifest["eos_id"]
    assert (manifest["vocab_size"], eos, manifest["dtype"]) == (257, 256, "uint16")
    assert _decode_documents(out) == [list(d.encode()) + [eos] for d in DOCS]
    assert manifest["documents"] == 3 and manifest["tokens"] == sum(len(d.encode()) + 1 for d in DOCS)
    assert [s["tokens"] for s in manifest["shards"]][:-1] == [7] * (len(manifest["shards"]) - 1)
    assert Tokenizer.from_file(str(out / "tokenizer.json")).decode(_decode_documents(out)[1]) == DOCS[1]


def test_same_output_whatever_the_worker_count(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * (i % 7 + 1)}) + "\n" for i in range(500)))
    one = prepare([str(src)], "bpe:300", str(tmp_path / "one"), workers=1)
    two = prepare([str(src)], "bpe:300", str(tmp_path / "two"), workers=2)
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]


def test_a_given_tokenizer_json_is_used_and_copied_and_a_large_vocabulary_takes_uint32(tmp_path):
    vocab = {EOS_TOKEN: 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(70_000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "doc.txt").write_text("w5 w69999 nope")
    manifest = prepare([str(tmp_path / "doc.txt")], str(tmp_path / "tokenizer.json"), str(tmp_path / "out"))
    assert manifest["dtype"] == "uint32" and manifest["vocab_size"] == 70_002
    assert _decode_documents(tmp_path / "out") == [[7, 70_001, 1, 0]]
    assert (tmp_path / "out" / "tokenizer.json").read_text() == (tmp_path / "tokenizer.json").read_text()


def test_sharded_tokens_slice_lazily_across_shards(tmp_path):
    a, b = np.arange(5, dtype=np.uint16), np.arange(5, 9, dtype=np.uint16)
    tokens = ShardedTokens([a, b])
    view = tokens[3:8]
    assert isinstance(view, ShardedTokens) and len(view) == 5
    assert np.asarray(view[1:4], dtype=np.int64).tolist() == [4, 5, 6]
    assert np.asarray(tokens[:-2]).tolist() == list(range(7)) and len(tokens[9:]) == 0


@pytest.mark.parametrize("case,expected", [
    ("missing_key", "error: {dir}/b.jsonl:2: no 'text' key; pass --text-key with the field that holds the text"),
    ("bad_json", "error: {dir}/b.jsonl:2: not JSON (Expecting property name"),
    ("no_file", "error: {dir}/nothing*.jsonl: no such file, or no files match"),
    ("bad_tokenizer", "error: {dir}/a.jsonl: not a Hugging Face tokenizer.json"),
    ("bad_parquet", "error: {dir}/c.parquet: not a Parquet file"),
])
def test_bad_input_is_one_line_with_file_and_line_and_leaves_nothing(tmp_path, case, expected):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    inputs, tokenizer = [str(d / "a.jsonl")], "bytes"
    if case in ("missing_key", "bad_json"):
        (d / "b.jsonl").write_text(json.dumps({"text": "ok"}) + "\n" + ("{\"body\": 1}" if case == "missing_key"
                                                                         else "{nope") + "\n")
        inputs.append(str(d / "b.jsonl"))
    elif case == "no_file":
        inputs.append(str(d / "nothing*.jsonl"))
    elif case == "bad_tokenizer":
        tokenizer = str(d / "a.jsonl")
    elif case == "bad_parquet":
        (d / "c.parquet").write_text("not parquet")
        inputs.append(str(d / "c.parquet"))
    out = tmp_path / "out"
    proc = _prepare_cli("--input", *inputs, "--tokenizer", tokenizer, "--out", str(out), "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(expected.format(dir=d))
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_an_interrupted_run_leaves_no_dataset(tmp_path, monkeypatch):
    src = tmp_path / "docs.txt"
    src.write_text("x" * 100)
    monkeypatch.setattr(prepare_module.ShardWriter, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        prepare([str(src)], "bytes", str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["docs.txt"]


def test_an_existing_out_dir_is_refused_untouched(tmp_path):
    (tmp_path / "doc.txt").write_text("hello")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("mine")
    proc = _prepare_cli("--input", str(tmp_path / "doc.txt"), "--tokenizer", "bytes", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert os.listdir(tmp_path / "out") == ["keep"]


def test_cli_reports_what_it_wrote(tmp_path):
    (tmp_path / "doc.txt").write_text("hello world")
    proc = _prepare_cli("--input", str(tmp_path / "doc.txt"), "--tokenizer", "bytes", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {tmp_path / 'out'}: 12 tokens, 1 documents, 1 shards of uint16, vocab 257")
    assert read_manifest(str(tmp_path / "out"))["tokenizer"] == "tokenizer.json"


def llama_style_tokenizer() -> Tokenizer:
    """A tokenizer whose post-processor begins each text with <s>, as Llama's tokenizers do."""
    from tokenizers import processors
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(["first", "document", "third"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])])
    return tok


def test_documents_begin_with_the_bos_the_tokenizer_adds(tmp_path):
    tok = llama_style_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("first document", "third")))
    manifest = prepare([str(tmp_path / "docs.jsonl")], str(tmp_path / "tokenizer.json"), str(tmp_path / "out"))
    # what the tokenizer itself gives for a text, then the end-of-text token
    assert _decode_documents(tmp_path / "out") == [tok.encode(t).ids + [1] for t in ("first document", "third")]
    assert manifest["bos_ids"] == [0] and _decode_documents(tmp_path / "out")[0][0] == 0


def test_a_tokenizer_without_bos_adds_none(tmp_path):
    (tmp_path / "doc.txt").write_text("third")
    manifest = prepare([str(tmp_path / "doc.txt")], "bytes", str(tmp_path / "out"))
    assert manifest["bos_ids"] == [] and _decode_documents(tmp_path / "out") == [list(b"third") + [256]]
