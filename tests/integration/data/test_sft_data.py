"""Chat and instruction data, packing and the masked loss, in-process: the loss over masked targets is
transformers' loss, packed documents see only themselves (our Llama, GPT-2 and a transformers Llama), the
assistant's tokens are the trained ones, and bad records are one line naming file:line with nothing written."""
import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from framework.data import prepare as prepare_module
from framework.data.assets import path as asset_path
from framework.data.assets import tiny_chat
from framework.data.batches import GlobalBatchSampler, Packed, micro_batches, plan_packing
from framework.data.chat import ChatError
from framework.data.documents import DocumentError
from framework.data.prepare import ChatOptions, prepare
from framework.data.token_dataset import open_mask, open_starts, open_tokens, read_manifest
from framework.models.loss import IGNORE_INDEX, cross_entropy, global_batch
from tests.harness.helpers import run_framework

transformers = pytest.importorskip("transformers")

CHATS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                  {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye?"},
                  {"role": "assistant", "content": "Goodbye."}]},
    {"prompt": "Two?", "completion": "2."},
]


def _hf_llama(vocab: int = 64):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=128)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _docs(out):
    tokens, mask = np.asarray(open_tokens(str(out))), np.asarray(open_mask(str(out)))
    starts = open_starts(str(out))
    return [(tokens[a:b], mask[a:b]) for a, b in zip(starts[:-1], starts[1:])]


def test_masked_loss_is_transformers_loss_and_the_same_however_the_batch_is_split():
    model = _hf_llama()
    tokens = torch.randint(0, 64, (4, 24))
    labels = tokens.clone()
    labels[:, :9] = IGNORE_INDEX           # a prompt
    labels[1, :20] = IGNORE_INDEX          # rows train very different numbers of tokens
    labels[3, 15:] = IGNORE_INDEX
    with torch.no_grad():
        theirs = model(input_ids=tokens, labels=labels).loss
        logits = model(input_ids=tokens).logits[:, :-1]
    targets = labels[:, 1:]
    assert abs(float(cross_entropy(logits, targets)) - float(theirs)) <= 1e-5
    trained, sequences, width = int((targets != IGNORE_INDEX).sum()), targets.shape[0], targets.shape[1]
    for parts in (1, 2, 4):                # micro-batches of the same global batch: the mean of their shares
        with global_batch(trained, sequences, width):
            shares = [cross_entropy(x, y) for x, y in zip(logits.split(4 // parts), targets.split(4 // parts))]
        assert abs(float(torch.stack(shares).mean()) - float(theirs)) <= 1e-5


def _packed_vs_alone(forward, vocab=64):
    lengths = [7, 12, 1, 9, 3]
    tokens = torch.randint(0, vocab, (1, sum(lengths)))
    documents = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]
    with torch.no_grad():
        packed = forward(tokens, documents)
        at, worst = 0, 0.0
        for n in lengths:
            alone = forward(tokens[:, at:at + n], None)
            worst = max(worst, float((alone - packed[:, at:at + n]).abs().max()))
            at += n
    return worst


@pytest.mark.parametrize("family", ["llama", "gpt2", "hf"])
def test_packed_documents_give_each_document_its_logits_alone(family, tmp_path):
    torch.manual_seed(0)
    if family == "llama":
        from framework.models.llama.model import Llama
        model = Llama(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64).eval()
    elif family == "gpt2":
        from framework.models.gpt2.model import GPT2
        model = GPT2(dim=32, n_layers=2, n_heads=4, vocab_size=64, max_seq_len=64).eval()
    else:
        from framework.models.hf.model import HFCausalLM
        _hf_llama().config.save_pretrained(tmp_path)
        model = HFCausalLM(config=str(tmp_path)).eval()
    forward = lambda t, d: model(t) if d is None else model(t, d)       # noqa: E731
    assert _packed_vs_alone(forward) <= 1e-5


def test_flex_attentions_document_mask_is_the_dense_masks_attention():
    """The CUDA path (flex_attention's BlockMask, here in eager mode) and the CPU path compute the same."""
    import warnings
    from framework.models.documents import DocumentLayout, attend
    documents = torch.repeat_interleave(torch.arange(4), torch.tensor([20, 50, 1, 57]))[None].expand(2, -1)
    q = torch.randn(2, 4, 128, 8)
    k, v = torch.randn(2, 2, 128, 8), torch.randn(2, 2, 128, 8)
    dense = attend(q, k, v, DocumentLayout(documents, use_flex=False).mask, enable_gqa=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # flex_attention warns that eager mode is slow
        flex = attend(q, k, v, DocumentLayout(documents, use_flex=True).mask, enable_gqa=True)
    assert float((dense - flex).abs().max()) <= 1e-5


def test_chat_records_train_the_assistant_turns_in_the_chat_template(tmp_path):
    src = _write_jsonl(tmp_path / "chats.jsonl", CHATS)
    manifest = prepare([str(src)], "bytes", str(tmp_path / "out"), workers=1, chat=ChatOptions("chatml"))
    assert manifest["loss_mask"] and manifest["documents"] == 2 and manifest["stop_tokens"][0] == "<|im_end|>"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    (ids, mask), (ids2, mask2) = _docs(tmp_path / "out")
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?")
    assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == \
        "Hello.<|im_end|>\nGoodbye.<|im_end|>\n"
    assert tok.decode(ids2[mask2 == 1].tolist(), skip_special_tokens=False) == "2.<|im_end|>\n"
    # last: only the final answer; all: every token but the first (nothing before it predicts it)
    last = prepare([str(src)], "bytes", str(tmp_path / "last"), workers=1, chat=ChatOptions("chatml", "last"))
    (ids, mask), _ = _docs(tmp_path / "last")
    assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "Goodbye.<|im_end|>\n"
    prepare([str(src)], "bytes", str(tmp_path / "all"), workers=1, chat=ChatOptions("chatml", "all"))
    (ids, mask), _ = _docs(tmp_path / "all")
    assert mask[0] == 0 and mask[1:].all() and last["train_on"] == "last"


def test_the_tokenizers_own_template_is_used_and_a_template_it_lacks_is_refused(tmp_path):
    """A Hugging Face tokenizer dir with its chat template (llama3's, which needs its special tokens)."""
    from framework.data.chat import TEMPLATES
    from framework.data.tokenizer import byte_tokenizer, write_hf_files
    tok = byte_tokenizer()
    tok.add_special_tokens(list(TEMPLATES["llama3"].special_tokens))
    own = tmp_path / "tok"
    own.mkdir()
    write_hf_files(tok, str(own), chat_template=TEMPLATES["llama3"].jinja, bos_token="<|begin_of_text|>")
    src = _write_jsonl(tmp_path / "chats.jsonl", CHATS[:1])
    prepare([str(src)], str(own), str(tmp_path / "out"), workers=1)
    (ids, mask), = _docs(tmp_path / "out")
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "Hello.<|eot_id|>Goodbye.<|eot_id|>"
    # llama3's tokenizer has none of ChatML's tokens: refused, naming the tokenizer and what fits it
    with pytest.raises(ChatError, match=r"chatml chat template writes <\|im_start\|>, which this tokenizer lacks.*llama3"):
        prepare([str(src)], str(own), str(tmp_path / "chatml"), workers=1, chat=ChatOptions("chatml"))
    assert not (tmp_path / "chatml").exists()


@pytest.mark.parametrize("record,expected", [
    ({"messages": [{"content": "hi"}, {"role": "assistant", "content": "yo"}]}, "message 1 has no role"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
     "message 2 is an empty assistant turn"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn to train on"),
    ({"text": "plain"}, "not a chat record"),
])
def test_bad_chat_records_name_file_and_line_and_leave_nothing(tmp_path, record, expected):
    src = _write_jsonl(tmp_path / "chats.jsonl", [CHATS[0], record])
    with pytest.raises(DocumentError) as err:
        prepare([str(src)], "bytes", str(tmp_path / "out"), workers=1, chat=ChatOptions("chatml"))
    assert str(err.value).startswith(f"{src}:2: {expected}")
    assert sorted(os.listdir(tmp_path)) == ["chats.jsonl"]


def test_a_conversation_without_any_template_is_refused_with_its_line(tmp_path):
    src = _write_jsonl(tmp_path / "chats.jsonl", [CHATS[1], CHATS[0]])    # a plain pair needs none
    with pytest.raises(ChatError, match=rf"^{src}:2: a conversation needs a chat template, and the tokenizer has none"):
        prepare([str(src)], "bytes", str(tmp_path / "out"), workers=1)
    assert sorted(os.listdir(tmp_path)) == ["chats.jsonl"]


def test_bad_chat_data_stops_the_cli_and_the_launcher_in_one_line_with_exit_2(tmp_path):
    src = _write_jsonl(tmp_path / "chats.jsonl", [CHATS[0], {"messages": [{"role": "user", "content": "?"},
                                                                         {"role": "assistant", "content": ""}]}])
    proc = run_framework(["--input", str(src), "--tokenizer", "bytes", "--chat-template", "chatml", "--out",
                          str(tmp_path / "out")], module="framework.data.prepare")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        f"error: {src}:2: message 2 is an empty assistant turn; there is nothing to train on"
    proc = run_framework(["data=chat", f"data.path={src}", "data.tokenizer=bytes", "data.chat_template=chatml",
                          f"data.cache_dir={tmp_path / 'cache'}"], tmp_path / "run")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        f"error: data.path: {src}:2: message 2 is an empty assistant turn; there is nothing to train on"
    assert sorted(os.listdir(tmp_path)) == ["chats.jsonl"]    # no dataset, no cache entry, no run dir


def test_a_saved_hf_dataset_is_read_and_a_hub_id_is_refused_offline(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(CHATS[:1] * 3).save_to_disk(str(tmp_path / "saved"))
    manifest = prepare([str(tmp_path / "saved")], "bytes", str(tmp_path / "out"), workers=1,
                       chat=ChatOptions("chatml"))
    assert manifest["documents"] == 3 and manifest["loss_mask"]
    from framework.data.sources.datasets import load
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DocumentError, match="not a local path, and the Hugging Face Hub is out of reach: offline"):
        load("someone/chats")


def test_packing_keeps_examples_whole_unless_longer_than_a_sequence():
    starts = np.array([0, 5, 12, 30, 33])           # lengths 5, 7, 18, 3; rows of 10 tokens
    piece_start, piece_len, row_first = plan_packing(starts, 10, "split")
    rows = [list(zip(piece_start[a:b], piece_len[a:b])) for a, b in zip(row_first[:-1], row_first[1:])]
    assert rows == [[(0, 5)], [(5, 7)], [(12, 10)], [(22, 8)], [(30, 3)]]
    piece_start, piece_len, row_first = plan_packing(starts, 10, "truncate")
    assert list(zip(piece_start, piece_len)) == [(0, 5), (5, 7), (12, 10), (30, 3)] and len(row_first) == 5
    starts = np.array([0, 4, 7, 9])                 # 4 + 3 + 2 fit one row of 10
    assert plan_packing(starts, 10, "split")[2].tolist() == [0, 3]


def test_packed_batches_mask_what_is_not_trained_and_are_the_same_whatever_the_dp_degree():
    lengths = np.array([6, 9, 4, 11, 5, 8, 7, 3] * 4)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.arange(starts[-1]) % 97 + 1
    mask = (np.arange(starts[-1]) % 3 != 0).astype(np.uint8)
    layout = Packed(tokens, mask, starts, seq_len=15)
    sampler = GlobalBatchSampler(layout, 15, 4, seed=1)
    whole = sampler.local_batch(0, 0, 1)
    halves = [sampler.local_batch(0, r, 2) for r in range(2)]
    assert torch.equal(whole.tokens, torch.cat([h.tokens for h in halves]))
    assert sampler.trained_tokens(0) == int(whole.trained[:, 1:].sum())
    x, y, documents = micro_batches(whole, 4)[0]
    assert torch.equal(y == IGNORE_INDEX, ~whole.trained[:, 1:])
    for row in range(4):
        starts_here = torch.nonzero(torch.diff(documents[row]) != 0).flatten() + 1
        # the first token of each packed example is never a target (its row's previous token is another's)
        assert (y[row, starts_here - 1] == IGNORE_INDEX).all()


def test_the_shipped_chats_are_what_the_generator_makes_and_small():
    text = open(asset_path(tiny_chat.FILE), encoding="utf-8").read()
    assert text == tiny_chat.text() and len(text.encode()) < 1_000_000 and len(text.splitlines()) >= 300


def test_prepare_counts_conversations_for_a_launch_time_source(tmp_path):
    """data=chat prepares once into a content-named dir and a second launch reuses it."""
    from framework.data.sources import source_named
    src = _write_jsonl(tmp_path / "chats.jsonl", CHATS * 3)
    cfg = OmegaConf.create({"source": "chat", "path": str(src), "tokenizer": "bytes", "chat_template": "chatml",
                            "train_on": "assistant", "text_key": "text", "split": "train",
                            "cache_dir": str(tmp_path / "cache"), "prepared": None})
    chat = source_named("chat")
    chat.resolve(cfg)
    first = cfg.prepared
    assert read_manifest(first)["documents"] == 6
    calls = []
    original = prepare_module.prepare
    prepare_module.prepare = lambda *a, **k: calls.append(a) or original(*a, **k)
    try:
        cfg.prepared = None
        chat.resolve(cfg)
    finally:
        prepare_module.prepare = original
    assert cfg.prepared == first and not calls
