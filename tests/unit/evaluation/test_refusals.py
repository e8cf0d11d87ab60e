"""Bad input to `python -m framework.eval` and to eval.*: one `error:` line naming the argument or key, exit 2,
before any model is read or any worker starts (the commands run in this process; lm-eval is imported once)."""
import importlib

import pytest

from tests.harness.helpers import FAST
from tests.harness.servers import refused

GENERATIVE = """task: fw_test_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
"""
MISSING = GENERATIVE.replace("fw_test_generate", "fw_test_missing").replace("generate_until", "multiple_choice")


@pytest.fixture
def tasks_dir(tmp_path):
    """A folder of two task YAMLs of one's own: a generative one, and one whose data file is not there."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1 + 1 =", "answer": "2"}\n')
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "generate.yaml").write_text(GENERATIVE.format(rows=rows))
    (folder / "missing.yaml").write_text(MISSING.format(rows=tmp_path / "gone.jsonl"))
    return folder


@pytest.fixture
def command(monkeypatch, capsys):
    """framework.eval's main in this process; its exit code and its stderr lines."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")
    main = importlib.import_module("framework.eval").main

    def run(*argv: str) -> tuple[int, list[str]]:
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err.strip().splitlines()
    return run


@pytest.mark.parametrize("args,line", [
    (["--tasks", "no_such_task"], "error: --tasks: 'no_such_task' is not a task lm-eval knows"),
    (["--tasks", "fw_test_missing"], "error: --tasks: task fw_test_missing: its data cannot be read "
                                     "(FileNotFoundError"),
    (["--tasks", "fw_test_generate"], "error: --tasks: fw_test_generate generates text"),
    (["--tasks", "fw_pytext", "--limit", "0"], "error: argument --limit: must be at least 1, got 0"),
    (["--tasks", "fw_pytext"], "error: checkpoint: "),
])
def test_the_command_refuses_in_one_line(command, tasks_dir, tmp_path, args, line):
    (tmp_path / "empty").mkdir()
    code, err = command(str(tmp_path / "empty"), "--include-path", str(tasks_dir), *args)
    assert code == 2
    assert [e for e in err if e.startswith("error:")] == err[-1:] and err[-1].startswith(line), err
    if line == "error: checkpoint: ":
        assert "neither a checkpoint step dir (meta.json) nor an export dir" in err[-1]


@pytest.mark.parametrize("overrides,line", [
    (["eval.tasks=[fw_pytext]", "eval.every=null"], "error: eval.tasks: are never evaluated: eval.every is null and "
                                                    "trainer.eval_every=0"),
    (["eval.tasks=[no_such_task]"], "error: eval.tasks: 'no_such_task' is not a task lm-eval knows"),
    (["eval.tasks=[fw_pytext]", "eval.limit=0"], "error: eval.limit: must be at least 1"),
    (["eval.tasks=[fw_pytext]", "eval.apply_chat_template=true"],
     "error: eval.apply_chat_template: the data records no chat template"),
    (["eval.tasks=[fw_pytext]", "eval.include_path=[/no/such/folder]"],
     "error: eval.include_path: /no/such/folder is not a folder"),
    (["eval.tasks=[fw_test_generate]", "eval.include_path=[{tasks}]"],
     "error: eval.tasks: fw_test_generate generates text, which is not evaluated in the loop"),
    (["eval.tasks=[fw_pyfacts]", "checkpoint.enabled=true", "checkpoint.keep_best=1",
      "checkpoint.score=eval/fw_pytext/bits_per_byte"],
     "error: checkpoint.score: ranks by eval/fw_pytext/bits_per_byte, but eval.tasks=['fw_pyfacts'] does not"),
    (["eval.tasks=[fw_pytext]", "eval.every=3", "checkpoint.enabled=true", "checkpoint.interval=2",
      "checkpoint.keep_best=1", "checkpoint.score=eval/fw_pytext/bits_per_byte"],
     "error: checkpoint.keep_best: ranks by eval/fw_pytext/bits_per_byte, evaluated every 3 steps"),
])
def test_eval_keys_are_refused_before_launch(compose_config, tasks_dir, tmp_path, monkeypatch, overrides, line):
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")
    cfg = compose_config([*FAST, "eval.every=2", *(o.format(tasks=tasks_dir) for o in overrides)])
    err = refused(cfg, tmp_path / "run")
    assert len(err) == 1 and err[0].startswith(line), err
