"""eval.tasks in a training job and `python -m framework.eval` on its checkpoint: the same model scored every way
(in the loop; the command on the checkpoint, on the export and in a bucket; lm-eval's own HFLM on the export) gives
the same numbers; checkpoint.keep_best ranks by a benchmark score; the scores move no random state (a LoRA run with dropout, which
draws from torch's global generator, trains the same losses with and without them); the run summary shows their
time apart. One job with the scores and one without, shared by every test here."""
import importlib
import json

import pytest

from tests.harness.helpers import FAST, check_ok, read_metrics, run_framework
from tests.harness.servers import make_bucket

TASKS = ("fw_pyfacts", "fw_pytext")
LIMIT = 8
SCORE = "eval/fw_pytext/bits_per_byte"
TRAIN = [*FAST, "trainer.max_steps=6", "trainer.eval_every=2", "checkpoint.enabled=true", "checkpoint.interval=2",
         "lora.enabled=true", "lora.dropout=0.1"]
SCORED = [f"eval.tasks=[{','.join(TASKS)}]", f"eval.limit={LIMIT}", "checkpoint.keep_last=1",
          "checkpoint.keep_best=1", f"checkpoint.score={SCORE}", "checkpoint.score_mode=max"]
LOGLIKELIHOOD = ("word_perplexity", "byte_perplexity", "bits_per_byte")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("in_loop")
    procs = {"scored": run_framework([*TRAIN, *SCORED], root / "scored"), "plain": run_framework(TRAIN, root / "plain")}
    for proc in procs.values():
        check_ok(proc)
    return root, procs


@pytest.fixture
def offline(monkeypatch):
    """The command sets the offline variables in its process; here that is pytest's, which gets them back."""
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")


def _in_loop(run_dir, step: int) -> dict[str, float]:
    record = next(r for r in read_metrics(run_dir) if r["step"] == step and SCORE in r)
    return {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("eval/")}


def _scores(out) -> dict[str, float]:
    return {f"{r['task']}/{r['metric']}": r["value"] for r in json.loads(out.read_text())["scores"]}


def _assert_same(ours: dict, theirs: dict, rel: float = 1e-4) -> None:
    assert set(ours) == set(theirs) and ours
    for key, value in theirs.items():
        if key.rsplit("/", 1)[1] in LOGLIKELIHOOD:
            assert ours[key] == pytest.approx(value, rel=rel), key
        else:
            assert ours[key] == value, key


def test_the_scores_move_no_random_state(runs):
    root, _ = runs
    scored, plain = read_metrics(root / "scored"), read_metrics(root / "plain")
    assert [r["loss"] for r in scored] == [r["loss"] for r in plain]
    assert [r.get("val_loss") for r in scored] == [r.get("val_loss") for r in plain]
    assert [r["step"] for r in scored if SCORE in r] == [2, 4, 6]
    assert not any(k.startswith("eval/") for r in plain for k in r)


def test_the_command_and_lm_evals_hflm_give_the_in_loop_scores(runs, tmp_path, offline, capsys):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from framework.evaluation.tasks import SHIPPED
    from framework.export.__main__ import main as export_main
    root, _ = runs
    checkpoints = root / "scored" / "checkpoints"
    command = importlib.import_module("framework.eval")
    out = tmp_path / "scores.json"
    assert command.main([str(checkpoints), "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["scores"]
    assert all(f"{r['task']}" in printed for r in rows)
    ours = _scores(out)

    assert export_main([str(checkpoints), str(tmp_path / "hf"), "--merge"]) == 0
    newline = AutoTokenizer.from_pretrained(tmp_path / "hf")("\n", add_special_tokens=False)["input_ids"][0]
    hf = HFLM(pretrained=str(tmp_path / "hf"), backend="causal", dtype="float32", device="cpu", batch_size=8,
              max_length=32, prefix_token_id=newline)      # FAST's data.seq_len; byte models: no BOS, EOS 256 unfed
    results = simple_evaluate(model=hf, tasks=list(TASKS), limit=LIMIT, bootstrap_iters=0,
                              task_manager=TaskManager(include_path=SHIPPED, include_defaults=False))["results"]
    theirs = {f"{task}/{key.split(',')[0]}": value for task, scores in results.items()
              for key, value in scores.items() if "," in key and "_stderr" not in key}
    _assert_same(ours, theirs)
    _assert_same(_in_loop(root / "scored", 6), theirs)
    # the command reads the export as it reads the checkpoint (told the context the job trained with, as HFLM is)
    assert command.main([str(tmp_path / "hf"), "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--max-length",
                         "32", "--out", str(tmp_path / "export.json")]) == 0
    _assert_same(_scores(tmp_path / "export.json"), theirs)


def test_the_command_scores_a_checkpoint_in_a_bucket(runs, s3_here, offline, tmp_path):
    from framework import storage
    root, _ = runs
    step = root / "scored" / "checkpoints" / "step_00000006"
    url = f"{make_bucket(s3_here, 'scores')}/run/step_00000006"
    for path in (p for p in step.rglob("*") if p.is_file()):
        storage.write_bytes(f"{url}/{path.relative_to(step).as_posix()}", path.read_bytes())
    command = importlib.import_module("framework.eval")
    out = tmp_path / "scores.json"
    assert command.main([url, "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--out", str(out)]) == 0
    _assert_same(_scores(out), _in_loop(root / "scored", 6))


def test_keep_best_keeps_the_best_scored_step_and_the_last(runs):
    root, _ = runs
    saves = {r["step"]: r[SCORE] for r in read_metrics(root / "scored") if SCORE in r}
    best = max(saves, key=saves.get)
    assert best != 6, f"the best score is the last step's, so keep_best would prove nothing: {saves}"
    kept = sorted(p.name for p in (root / "scored" / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert kept == [f"step_{best:08d}", "step_00000006"]


def test_the_summary_shows_the_benchmarks_time_apart(runs):
    _, procs = runs
    assert "benchmarks " in procs["scored"].stdout and "benchmarks " not in procs["plain"].stdout
    records = read_metrics(runs[0] / "scored")
    assert all(r["tasks_time"] > 0 for r in records if SCORE in r)
    assert all(r["tasks_time"] == 0 for r in records if SCORE not in r)
