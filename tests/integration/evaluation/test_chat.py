"""A model fine-tuned on chat data, scored with --apply-chat-template, gives what lm-eval's own HFLM gives on its
Hugging Face export with apply_chat_template=True (the template the run trained with, which the export carries),
and what eval.apply_chat_template scored in the loop at that step: accuracy equal, log-likelihood metrics within
1e-4."""
import importlib
import json

import pytest

from tests.harness.helpers import REPO, read_metrics

TASKS = ("fw_pyfacts", "fw_pytext", "fw_test_answer")
OWN = str(REPO / "tests" / "fixtures" / "eval_tasks")     # fw_test_answer: perplexity moves with the template
LIMIT = 2       # conftest's SFT_TINY scores as many in the loop
LOGLIKELIHOOD = ("word_perplexity", "byte_perplexity", "bits_per_byte", "perplexity")


def test_chat_template_scores_as_hflm_with_its_template(tmp_path, monkeypatch, sft_run):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from framework.evaluation.tasks import SHIPPED
    from framework.export.__main__ import main as export_main
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")
    step = sft_run / "checkpoints" / "step_00000001"
    out = tmp_path / "scores.json"
    command = importlib.import_module("framework.eval")
    assert command.main([str(step), "--tasks", ",".join(TASKS), "--limit", str(LIMIT), "--include-path", OWN,
                         "--apply-chat-template", "--out", str(out)]) == 0
    ours = {f"{r['task']}/{r['metric']}": r["value"] for r in json.loads(out.read_text())["scores"]}

    assert export_main([str(step), str(tmp_path / "hf")]) == 0
    hf = HFLM(pretrained=str(tmp_path / "hf"), backend="causal", dtype="float32", device="cpu", batch_size=8,
              max_length=256)      # sft_tiny's data.seq_len; the prefix is HFLM's own (the tokenizer's EOS)
    results = simple_evaluate(model=hf, tasks=list(TASKS), limit=LIMIT, bootstrap_iters=0, apply_chat_template=True,
                              task_manager=TaskManager(include_path=[SHIPPED, OWN], include_defaults=False))["results"]
    theirs = {f"{task}/{key.split(',')[0]}": value for task, scores in results.items()
              for key, value in scores.items() if "," in key and "_stderr" not in key}
    (in_loop,) = [r for r in read_metrics(sft_run) if r["step"] == 1]
    in_loop = {k.removeprefix("eval/"): v for k, v in in_loop.items() if k.startswith("eval/")}
    for other in (theirs, in_loop):
        assert set(ours) == set(other) and ours
        for key, value in other.items():
            if key.rsplit("/", 1)[1] in LOGLIKELIHOOD:
                assert ours[key] == pytest.approx(value, rel=1e-4), key
            else:
                assert ours[key] == value, key


def test_a_model_without_a_chat_template_is_refused(monkeypatch, capsys, trained_run):
    plain = trained_run("parallel=single")      # model=tiny on bytes, no chat template
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(variable, "1")
    command = importlib.import_module("framework.eval")
    assert command.main([str(plain / "checkpoints"), "--tasks", "fw_pyfacts",
                         "--apply-chat-template"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --apply-chat-template: ") and "records no chat template" in err[-1], err
