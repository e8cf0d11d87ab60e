"""The corpus commands of docs/how-to/own-data.md (prepare, train, generate, export), run in order as written
from a directory other than the checkout, in README's environment (the page installs no extra)."""

from tests.harness.docs_commands import run_as_written, run_by
from tests.fixtures.corpora import write_pydoc_jsonl

COMMANDS = [
    "python -m framework.data.prepare --input corpus/*.jsonl --tokenizer bpe:4096 --out data/corpus",
    "python -m framework data=tokens data.path=data/corpus data.seq_len=128 trainer.max_steps=10 "
    "hydra.run.dir=outputs/corpus",
    'python -m framework.generate outputs/corpus/checkpoints/step_00000010 --prompt "The " --max-new-tokens 40 --seed 0',
    "python -m framework.export outputs/corpus/checkpoints/step_00000010 hf_out",
]


def test_the_docs_show_these_commands():
    assert [c.text for c in run_by(__file__)] == COMMANDS


def test_docs_corpus_commands_run_as_written(tmp_path):
    write_pydoc_jsonl(tmp_path / "corpus", parts=2)
    outputs = [run_as_written(command, tmp_path, timeout=600).stdout for command in run_by(__file__)]
    assert outputs[0].startswith("wrote data/corpus:") and "vocab 4096" in outputs[0]
    assert outputs[2].startswith("The ") and len(outputs[2]) > 10
    assert sorted(p.name for p in (tmp_path / "hf_out").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
