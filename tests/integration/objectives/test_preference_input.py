"""Bad preference input and jobs a preference objective cannot train, each refused before any work with one
`error:` line naming the file and row or the key, exit 2, nothing written: a record without `chosen` or
`rejected`, identical answers, strings mixed with message lists; preference data with packing, or with an
objective that trains tokens; a non-positive objective.beta (orpo); a preference objective (dpo, orpo) on token
data; DPO's reference where the strategy builds no frozen copy; a reference to precompute for an objective that
reads none. One job of the real entrypoint shows the line and the exit code a user sees."""
import json

import pytest

from framework.data.assets import path as asset_path
from tests.harness.helpers import FAST, run_framework
from tests.harness.servers import refused

GOOD = {"prompt": "What is 1 plus 1?", "chosen": " 2.", "rejected": " 3."}
PAIRS = ["data=preference", "data.tokenizer=bytes", "data.seq_len=64", "data.val_fraction=0"]


def _pairs_file(tmp_path, bad: dict, at: int = 3):
    rows = [dict(GOOD) for _ in range(4)]
    rows.insert(at - 1, bad)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("bad, says", [
    ({"prompt": "Hi", "chosen": " Hello."}, "no 'rejected'; a preference record has 'prompt', 'chosen' and 'rejected'"),
    ({"prompt": "Hi", "rejected": " Go."}, "no 'chosen'"),
    ({"prompt": "Hi", "chosen": " Same.", "rejected": " Same."}, "'chosen' and 'rejected' are identical"),
    ({"prompt": "Hi", "chosen": [{"role": "assistant", "content": "a"}], "rejected": " b"},
     "must all be strings or all message lists"),
])
def test_a_bad_record_is_one_line_naming_file_and_row(compose_config, tmp_path, bad, says):
    path = _pairs_file(tmp_path, bad)
    cfg = compose_config([*FAST, *PAIRS, f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}",
                          "objective=simpo"])
    lines = refused(cfg, tmp_path / "run")
    assert len(lines) == 1 and lines[0].startswith(f"error: data.path: {path}:3: ") and says in lines[0], lines
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())   # no dataset left


@pytest.mark.parametrize("overrides, key, says", [
    (["data.packing=true"], "data.packing", "set data.packing=false"),
    (["objective=lm"], "data.source", "use objective=dpo or objective=simpo or objective=orpo"),
    (["objective=orpo", "objective.beta=0"], "objective.beta", "must be positive, got 0"),
    (["objective=orpo", "objective.beta=-0.1"], "objective.beta", "must be positive, got -0.1"),
    (["objective=dpo", "parallel=3d", "parallel.tp=1", "parallel.pp=2"], "parallel.pp",
     "set parallel.pp=1, or data.packing=true where the data packs (preference pairs do not)"),
    (["objective.precompute_reference=true"], "objective.precompute_reference",
     "objective=simpo reads no reference model, so there is nothing to precompute"),
])
def test_jobs_a_preference_objective_cannot_train_are_refused_in_one_line(compose_config, tmp_path, overrides, key,
                                                                          says):
    cfg = compose_config([*FAST, *PAIRS, f"data.path={asset_path('tiny_prefs.jsonl')}", "data.chat_template=chatml",
                          f"data.cache_dir={tmp_path / 'cache'}", "objective=simpo", *overrides])
    lines = [line for line in refused(cfg, tmp_path / "run") if not line.startswith("prepared ")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: ") and says in lines[0], lines


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_a_preference_objective_on_token_data_is_refused(compose_config, tmp_path, objective):
    lines = refused(compose_config([*FAST, f"objective={objective}"]), tmp_path / "run")
    assert len(lines) == 1 and lines[0].startswith(f"error: objective: objective={objective} trains on "
                                                   f"chosen/rejected pairs"), lines


def test_the_user_sees_the_line_and_exit_code_2(tmp_path):
    path = _pairs_file(tmp_path, {"prompt": "Hi", "chosen": " Same.", "rejected": " Same."}, at=2)
    proc = run_framework([*FAST, *PAIRS, f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}",
                          "objective=dpo"], tmp_path / "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"error: data.path: {path}:2: 'chosen' and 'rejected' are "
                                                    f"identical; the pair teaches nothing")
    assert "Traceback" not in proc.stderr


def test_the_llama3_8b_dpo_recipe_is_admitted_on_its_node(compose_config, monkeypatch, tmp_path):
    """The recipe as a torchrun rank of its 8-GPU node sees it (the shipped pairs and byte tokens stand in for the
    user's, the planner's device check for the GPUs this host lacks)."""
    from framework.launch import admission
    for name, value in (("TORCHELASTIC_RUN_ID", "test"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "8")):
        monkeypatch.setenv(name, value)
    cfg = compose_config(["+recipe=llama3_8b_dpo", f"data.path={asset_path('tiny_prefs.jsonl')}", "data.tokenizer=bytes",
                          "data.chat_template=chatml", f"data.cache_dir={tmp_path / 'cache'}", "planner.check=false"])
    _, world, _ = admission.admit(cfg, explicit=set())
    assert world == 8 and cfg.lora.enabled and cfg.objective.name == "dpo"
