"""docs/how-to/preference.md: every command of its bash blocks runs as written from a directory outside the
checkout, in README's environment plus the `hf` extra the page installs, in order (dpo_tiny as written: the page
says what it learns within its steps; the other jobs shortened to 2 steps); dpo_tiny starts where the page says
(loss ln 2, every reward 0) and ends with rewards/accuracies above 0.5 and a positive margin; the LoRA job holds
no reference model of its own, nor does the one whose reference is precomputed (its pass said once); the export
writes the weights; ORPO's first loss is its NLL minus beta times its log_odds_ratio."""
import json
import math
import shutil

from framework.data.assets import path as asset_path
from tests.harness.docs_commands import extras_of, run_as_written, run_by

#: dpo_tiny's 60 steps are the recipe's point (it learns within them): ~50 s of CPU
RUNS_LONGEST = True


def _shortened(command: str) -> str:
    if "outputs/dpo " in command + " " or command.split()[1:3] != ["-m", "framework"]:
        return command + (" trainer.progress_bar=false" if "+recipe" in command else "")
    return command + " trainer.max_steps=2 trainer.log_every=1 trainer.eval_every=0 trainer.progress_bar=false"


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_page_says_to_install_the_extra_its_commands_need_before_the_first():
    first = run_by(__file__)[0]
    assert extras_of(first.page, first.block) == ("hf",)
    assert all(c.text.startswith("python -m framework") for c in run_by(__file__)) and len(run_by(__file__)) == 7


def test_preference_commands_run_as_written_and_dpo_tiny_learns(tmp_path):
    shutil.copyfile(asset_path("tiny_prefs.jsonl"), tmp_path / "pairs.jsonl")     # "your own pairs"
    cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    outputs = {c.text: run_as_written(c, tmp_path, _shortened(c.text), cache).stdout for c in run_by(__file__)}
    dpo = _records(tmp_path / "outputs" / "dpo")
    assert dpo[0]["step"] == 1 and abs(dpo[0]["loss"] - math.log(2)) < 1e-6
    assert all(dpo[0][k] == 0 for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"))
    last = [r for r in dpo if r["step"] > 40]       # a batch of 8 pairs is noisy: the mean of the last records
    assert sum(r["rewards/accuracies"] for r in last) / len(last) > 0.5, last
    assert sum(r["rewards/margins"] for r in last) / len(last) > 0, last
    assert dpo[-1]["reference_bytes"] == dpo[-1]["param_bytes"]     # a frozen copy, as large as the model
    summary = next(out for c, out in outputs.items() if "outputs/dpo " in c + " ")
    assert "preference pairs (trainer.global_batch_size counts pairs, 2 sequences each)" in summary
    lora = _records(tmp_path / "outputs" / "dpo_lora")
    assert "reference_bytes" not in lora[-1] and lora[-1]["rewards/margins"] != 0    # the base, adapters off
    simpo = _records(tmp_path / "outputs" / "simpo")
    assert "reference_bytes" not in simpo[-1] and simpo[-1]["logps/chosen"] < 0
    assert (tmp_path / "dpo_out" / "model.safetensors").is_file()
    orpo = _records(tmp_path / "outputs" / "orpo")     # no reference; the NLL and odds ratio as the page says
    assert "reference_bytes" not in orpo[-1] and orpo[-1]["nll_loss"] > 0 and orpo[-1]["log_odds_ratio"] < 0
    assert abs(orpo[0]["loss"] - (orpo[0]["nll_loss"] - 0.1 * orpo[0]["log_odds_ratio"])) < 1e-5
    precomputed = _records(tmp_path / "outputs" / "dpo_precomputed")
    assert "reference_bytes" not in precomputed[-1] and abs(precomputed[0]["loss"] - math.log(2)) < 1e-6
    said = next(out for c, out in outputs.items() if "outputs/dpo_precomputed" in c)
    trained = precomputed[0]["data/pairs"] - precomputed[0]["data/pairs_dropped"]    # every pair kept, once
    assert [line.split(" in ")[0] for line in said.splitlines() if line.startswith("objective.precompute_reference:")] \
        == [f"objective.precompute_reference: scored {trained} train pairs with the reference model"]
