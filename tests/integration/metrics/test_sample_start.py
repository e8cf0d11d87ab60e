"""Where a text sample (trainer.sample_every) starts when trainer.sample_prompt gives it no token: where a document
of the data starts, after the tokenizer's BOS, else its end-of-text token. Byte-level text holds neither (its
tokenizer's end-of-text id is one past the bytes the model embeds): the default empty prompt there used to crash the
first sample step (IndexError, exit 1) and is now refused before work, naming trainer.sample_prompt."""
import json

import pytest
from tokenizers import Tokenizer, models, processors

from tests.harness.helpers import derive_and_validate
from framework.data.prepare import prepare
from framework.data.tokenizer import byte_tokenizer
from framework.errors import ConfigError
from framework.metrics.samples import start_tokens
from framework.strategies.registry import strategy_class
from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework
from tests.harness.servers import refused


def word_tokenizer(bos: bool, eos: bool) -> Tokenizer:
    vocab = {"[UNK]": 0, "a": 1, **({"<s>": 2} if bos else {}), **({"</s>": 3} if eos else {})}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    if bos:     # a Llama-style tokenizer: its post-processor puts <s> before a text
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    return tok


@pytest.mark.parametrize("bos,eos,start", [(True, True, [2]), (False, True, [3]), (False, False, [])],
                         ids=["BOS", "end-of-text", "neither"])
def test_an_empty_prompt_starts_where_a_document_starts(bos, eos, start):
    tok = word_tokenizer(bos, eos)
    assert start_tokens(tok, "") == start
    if bos:     # the BOS is what the tokenizer itself puts before a text
        assert tok.encode("a").ids == [*start, *tok.encode("a", add_special_tokens=False).ids]
    assert start_tokens(tok, "a") == [1]
    assert start_tokens(byte_tokenizer(), "") == [byte_tokenizer().token_to_id("<|endoftext|>")]


def test_the_default_prompt_on_byte_level_data_is_one_line_and_exit_2_before_any_work(tmp_path, compose_config):
    assert refused(compose_config([*FAST, "trainer.sample_every=2"]), tmp_path / "run") == [
        "error: trainer.sample_prompt: is empty, so a sample would start from the tokenizer's end-of-text token "
        "(256), which the data never holds (data.source=pydoc, data.vocab_size=256); give the samples a start, e.g. "
        "trainer.sample_prompt='The '"]


def test_a_prompt_that_encodes_outside_the_data_is_refused(compose_config):
    cfg = compose_config([*FAST, "trainer.sample_every=2", "trainer.sample_prompt='<|endoftext|>'"])
    with pytest.raises(ConfigError) as refusal:
        derive_and_validate(cfg, 1, strategy_class(cfg.parallel.name))
    assert str(refusal.value).startswith("trainer.sample_prompt: '<|endoftext|>' encodes to token 256, which the data "
                                         "never holds")


def test_the_default_prompt_on_prepared_data_samples_from_its_end_of_text(tmp_path):
    """A prepared dataset separates its documents with the tokenizer's end-of-text: the sample starts there."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}: " + "the quick brown fox " * 5}) + "\n"
                              for i in range(40)))
    prepare([str(corpus)], "bytes", str(tmp_path / "dataset"))
    proc = run_framework([*FAST, "trainer.max_steps=2", "data=tokens", f"data.path={tmp_path / 'dataset'}",
                          "trainer.sample_every=2", "trainer.sample_tokens=4"], tmp_path / "run")
    check_ok(proc)
    assert [r["step"] for r in read_metrics(tmp_path / "run") if isinstance(r.get("sample"), str)] == [2]
