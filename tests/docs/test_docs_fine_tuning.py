"""docs/how-to/fine-tuning.md: every command of its bash blocks runs as written from a directory outside the
checkout, in README's environment plus the `hf` extra the page installs, in order (training jobs shortened to
2 steps, lora_tiny to 30, so that the loss has room to fall; sft_tiny as written); the recipes sft_tiny and
lora_tiny learn, generate answers in the chat format what the page says it does, and export writes the adapter and the merged weights."""
import json
import shutil

from framework.data.assets import path as asset_path
from tests.harness.docs_commands import extras_of, run_as_written, run_by
from tests.harness.helpers import REPO


STEPS = 30
PAGE = REPO / "docs" / "how-to" / "fine-tuning.md"


def commands() -> list[str]:
    return [c.text for c in run_by(__file__)]


def _shortened(command: str) -> str:
    """sft_tiny and its generate as written (the page shows what the trained model answers), the rest shortened."""
    if "outputs/sft" in command:
        return command
    command = command.replace("step_00000200", f"step_{STEPS:08d}")
    if command.split()[1:3] == ["-m", "framework"]:
        # the recipes long enough for the loss to fall, the other jobs as the docs convention shortens them
        steps = STEPS if "+recipe=" in command else 2
        command += f" trainer.max_steps={steps} trainer.log_every=5 trainer.progress_bar=false"
    return command


def _losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_page_shows_runnable_commands_only_in_bash_blocks():
    assert all(c.startswith("python -m framework") for c in commands()) and len(commands()) >= 8


def test_the_page_says_to_install_the_extra_its_commands_need_before_the_first():
    first = run_by(__file__)[0]
    assert extras_of(first.page, first.block) == ("hf",)


def test_fine_tuning_commands_run_as_written(tmp_path):
    shutil.copyfile(asset_path("tiny_chat.jsonl"), tmp_path / "chats.jsonl")    # "your own conversations"
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}     # data.cache_dir's default lies below
    outputs = {c.text: run_as_written(c, tmp_path, _shortened(c.text), cache).stdout for c in run_by(__file__)}
    for run in ("sft", "lora"):      # lora_tiny trains adapters alone on a frozen random model: it falls slower
        got = _losses(tmp_path / "outputs" / run)
        assert got[-1] < got[0] - 0.2, (run, got)
    answer = next(out for c, out in outputs.items() if "framework.generate" in c).strip()
    assert f"prints `{answer}`" in " ".join(PAGE.read_text().split())      # what the page says it answers
    assert answer == "Snow is white."       # the data's own answer (framework/data/assets/tiny_chat.jsonl)
    assert sorted(p.name for p in (tmp_path / "lora_out" / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert (tmp_path / "lora_merged" / "model.safetensors").is_file()
    assert not (tmp_path / "lora_merged" / "adapter").exists()
    assert "chat_template" in json.loads((tmp_path / "lora_out" / "tokenizer_config.json").read_text())
    # one conversation a row: the package's chats are all shorter than a row of 257 tokens, and it says so
    first = json.loads((tmp_path / "outputs" / "rows" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["data/examples"] == 400 and first["data/examples_truncated"] == 0
    rows = next(out for c, out in outputs.items() if "data.packing=false" in c)
    assert "  data        400 examples, none longer than a row of 257 tokens (data.seq_len + 1)" in rows.splitlines()
