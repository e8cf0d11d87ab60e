"""docs/how-to/evaluation.md: every command of its bash blocks runs as written from a directory outside the
checkout, in README's environment plus the `eval` extra the page installs, in order: one training job (8 steps,
scored in the loop) whose checkpoints the page's other commands score. The in-loop job records the scores and its
checkpoints the one they are ranked by, the tables list every task's metrics, and the page's own task YAML runs
from the folder the page names. (The page's numbers after 200 steps come from benchmarks/evaluation_steps.py.)"""
import json
import re

from tests.harness.docs_commands import extras_of, run_as_written, run_by
from tests.harness.helpers import REPO

PAGE = REPO / "docs" / "how-to" / "evaluation.md"
METRICS = {"fw_pyfacts": {"acc", "acc_norm"}, "fw_pytext": {"bits_per_byte", "byte_perplexity", "word_perplexity"},
           "my_facts": {"acc"}}


def _own_task(folder) -> None:
    """The page's YAML in the folder it names, and a few rows in the file it names."""
    yaml = re.search(r"```yaml\n# (my_tasks/my_facts.yaml)\n(.*?)```", PAGE.read_text(), flags=re.S)
    (folder / "my_tasks").mkdir()
    (folder / yaml.group(1)).write_text(yaml.group(2))
    rows = [{"question": "The built-in that counts items is", "choices": ["len", "size"], "answer": 0},
            {"question": "The keyword that leaves a loop is", "choices": ["stop", "break"], "answer": 1}]
    (folder / "my_tasks" / "my_facts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _table(stdout: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in METRICS:
            found.setdefault(parts[0], set()).add(parts[1])
    return found


def test_the_page_says_to_install_the_extra_its_commands_need_before_the_first():
    first = run_by(__file__)[0]
    assert extras_of(first.page, first.block) == ("eval",)
    assert len(run_by(__file__)) == 3


def test_evaluation_commands_run_as_written(tmp_path):
    _own_task(tmp_path)
    for command in run_by(__file__):
        proc = run_as_written(command, tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=600)
        if "-m framework.eval " in command.text:
            tasks = command.text.split("--tasks ")[1].split()[0].split(",")
            assert _table(proc.stdout) == {t: METRICS[t] for t in tasks}, proc.stdout
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["checkpoint"].endswith("step_00000008") and len(scores["scores"]) == 5
    metrics = tmp_path / "outputs" / "tiny" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    scored = {r["step"]: r["eval/fw_pytext/bits_per_byte"] for r in records if "eval/fw_pytext/bits_per_byte" in r}
    assert sorted(scored) == [4, 8]
    for step, score in scored.items():      # what keep_best ranks them by (checkpoint.keep_last=2 keeps both here)
        meta = tmp_path / "outputs" / "tiny" / "checkpoints" / f"step_{step:08d}" / "meta.json"
        assert json.loads(meta.read_text())["score"] == {"eval/fw_pytext/bits_per_byte": score}
