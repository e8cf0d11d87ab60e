"""The GPU session (benchmarks/gpu_session.sh, benchmarks/gpu/): a dry run of every stage on this CPU at tiny
sizes writes the rows the GPU part of issue 45 must show, with the fields each needs; the time budget
skips what does not fit, with a line saying so, and keeps what finished; the docs page has a table for every
stage and a row for every job. The dry runs go four at a time (one module fixture), each its own session,
one thread per process: on two busy cores that is most of what keeps this file near a minute."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu import kernel_times, kernels, session as gpu_session
from benchmarks.gpu.processes import run_process
from benchmarks.gpu.stage import Column, Job, Session, Stage
from benchmarks.gpu.tables import tables
from tests.harness.helpers import REPO

#: each a session of its own; the planner's follows honest_single's in one, so it finds the measured row
CHAINS = (("honest_single", "planner"), ("checkpoints",), ("honest_fsdp", "honest_ddp", "honest_deepspeed"),
          ("float8", "kernels"))
PAGE = REPO / "docs" / "benchmarks" / "gpu-session.md"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{stage: its JSON lines}, and the session logs, of a dry run of every stage."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    runs = []
    for chain in CHAINS:
        out = tmp_path_factory.mktemp("gpu_session")
        cmd = ["bash", str(REPO / "benchmarks" / "gpu_session.sh"), "--dry-run", "--seconds", "400", "--out",
               str(out), *chain]
        runs.append((out, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, start_new_session=True)))
    stages, logs = {}, []
    for chain, (out, proc) in zip(CHAINS, runs):
        stdout, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, stdout[-4000:]
        logs.append(((out / "session.log").read_text(), stdout, out, chain))
        for path in out.glob("*.jsonl"):
            stages[path.stem] = [json.loads(line) for line in path.read_text().splitlines()]
    return stages, logs


def _rows(stages, stage: str) -> dict[str, dict]:
    lines = stages[stage]
    assert lines[0]["kind"] == "env" and lines[0]["dry_run"] is True and lines[0]["commit"], lines[0]
    rows = {line["job"]: line for line in lines if line["kind"] == "row"}
    failed = {job: row.get("error") or row.get("skipped") or row.get("refused") for job, row in rows.items()
              if row.get("error") or row.get("skipped") or (row.get("refused") and job != "ds_z3 compile")}
    assert not failed, failed
    return rows


def test_every_stage_ran_and_wrote_its_results(results):
    stages, logs = results
    assert set(stages) == set(gpu_session.STAGES)
    for log, stdout, out, chain in logs:
        assert set(log.splitlines()) <= set(stdout.splitlines())        # the log holds what the console showed
        assert {p.name for p in out.iterdir()} == {"session.log", *(f"{stage}.jsonl" for stage in chain)}


@pytest.mark.parametrize("stage", ("honest_single", "honest_fsdp", "honest_ddp"))
def test_honest_rows_hold_the_reported_step_against_the_trace_with_mfu(results, stage):
    rows = _rows(results[0], stage)
    strategies = [row for job, row in rows.items() if not job.startswith("plain")]
    assert strategies
    for row in strategies:
        # on a CPU the trace has no device work: the host's step spans stand in, and the row says so
        assert row["trace_from"] == "host" and row["trace_device_why"]
        assert row["reported_over_trace"] == pytest.approx(row["reported_s"] / row["trace_s"])
        assert 0.5 < row["reported_over_trace"] < 2, row
        assert row["tokens_per_sec"] > 0 and row["mfu"] > 0 and row["allocated_gib"] > 0


def test_deepspeed_refuses_compile_before_launch_and_its_row_says_so(results):
    row = _rows(results[0], "honest_deepspeed")["ds_z3 compile"]
    assert row["refused"].startswith("exit 2: error: trainer.compile: ") and "DeepSpeed" in row["refused"], row


def test_the_plain_loop_row_holds_the_framework_over_plain_ratio(results):
    rows = _rows(results[0], "honest_single")
    plain = rows["plain"]
    assert plain["framework_over_plain"] == pytest.approx(rows["single"]["tokens_per_sec"] / plain["tokens_per_sec"])
    assert plain["mfu"] > 0


def test_every_async_save_loads_and_deterministic_runs_repeat_and_resume_exactly(results):
    rows = _rows(results[0], "checkpoints")
    assert rows["single async saves"]["saves"] == "4,8,12" and rows["single async saves"]["all_saves"]
    for step in (4, 8, 12):
        save = rows[f"single save step {step}"]
        assert save["intact"] and save["loadable"] and save["distinct"] and save["tensors"] > 0, save
    assert rows["single repeat"]["identical"] is True, rows["single repeat"]
    assert rows["single resumed at 8"]["equal"] is True, rows["single resumed at 8"]


def test_float8_row_holds_its_ratio_to_bf16(results):
    rows = _rows(results[0], "float8")
    assert rows["float8"]["float8_over_bf16"] == pytest.approx(rows["float8"]["tokens_per_sec"] /
                                                               rows["bf16"]["tokens_per_sec"])


def test_kernel_rows_time_cp_on_each_kernel_moe_and_the_loss(results):
    rows = _rows(results[0], "kernels")
    for cp in (1, 2):
        flash = rows[f"cp={cp} flash"]
        assert flash["step_s"] > 0 and "flash" in flash["ops"], flash
        # a CPU has no memory-efficient kernel: null, with the reason
        efficient = rows[f"cp={cp} efficient"]
        assert efficient["step_s"] is None and "efficient cannot run" in efficient["why"], efficient
    assert rows["cp=2 flash"]["over_ideal"] == pytest.approx(2 * rows["cp=2 flash"]["step_s"] / rows["cp=1 flash"]["step_s"])
    loop = rows["moe loop"]
    assert loop["grouped_speedup"] > 0 and loop["max_rel_diff"] < 1e-5, loop
    assert rows["loss chunks"]["whole_gib"] > rows["loss chunks"]["chunked_gib"] > 0


def test_planner_rows_hold_the_planned_over_measured_step(results):
    rows = _rows(results[0], "planner")
    plan = rows["plan single"]
    measured = _rows(results[0], "honest_single")["single"]
    assert plan["measured_in"] == "honest_single" and plan["measured_s"] == measured["trace_s"]
    assert plan["planned_over_measured"] == pytest.approx(plan["planned_s"] / plan["measured_s"])


def test_the_tables_render_a_row_per_job_of_every_stage(results):
    stages, logs = results
    text = tables([out for _, _, out, _ in logs])
    for stage, lines in stages.items():
        assert f"### {stage}" in text
        for line in lines:
            if line["kind"] == "row":
                assert f"| {line['job']} |" in text, (stage, line["job"])


def test_a_failed_row_renders_with_its_error_and_log_lines(tmp_path):
    lines = [{"kind": "env", "stage": "float8", "dry_run": False, "gpu": "H100", "torch": "2.11", "commit": "abc"},
             {"kind": "row", "stage": "float8", "job": "float8 compile", "error": "exit 1: RuntimeError: boom",
              "log_tail": ["Traceback (most recent call last):", "RuntimeError: boom"]}]
    (tmp_path / "float8.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = tables([tmp_path])
    assert "H100, torch 2.11, commit `abc`" in text and "| failed: exit 1: RuntimeError: boom |" in text
    assert "```text\nTraceback (most recent call last):\nRuntimeError: boom\n```" in text


def _fake_stage(name: str, jobs: list[Job]) -> Stage:
    return Stage(name, "a test stage", (Column("value", "value"),), lambda session: jobs)


def test_a_stage_that_does_not_fit_is_skipped_and_a_job_past_its_stage_leaves_the_rows_before(tmp_path, monkeypatch):
    said = []
    session = Session(out=tmp_path, dry_run=False, deadline=time.monotonic() + 60, say=said.append)
    monkeypatch.setattr("benchmarks.gpu.stage.STAGE_LIMIT_S", 30.0)
    ran = []
    fits = _fake_stage("fits", [Job("first", 5, lambda run: (ran.append(1), run.row("first", value=1))),
                                Job("too long", 40, lambda run: ran.append(2)),
                                Job("raises", 5, lambda run: 1 / 0)])
    too_big = _fake_stage("too_big", [Job("huge", 500, lambda run: ran.append(3))])
    gpu_session.run_stages([too_big, fits], session, {"gpu": "test"})
    assert ran == [1]
    assert "== too_big: skipped: needs about 500 s, 60 s left of the session" in said
    assert any(line.startswith("too long") and "skipped: needs about 40 s" in line for line in said), said
    assert any(line.startswith("raises") and "FAILED: ZeroDivisionError" in line for line in said), said
    rows = [json.loads(line) for line in (tmp_path / "fits.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("job")) for r in rows] == [("env", None), ("row", "first"), ("row", "too long"),
                                                        ("row", "raises")]
    assert json.loads((tmp_path / "too_big.jsonl").read_text())["kind"] == "skipped"


def test_a_process_past_its_limit_is_stopped_and_its_lines_so_far_are_kept():
    seen = []
    done = run_process(["sh", "-c", 'echo \'{"job": "a"}\'; sleep 30'], 1.5, on_line=seen.append)
    assert done.code is None and done.wall_s < 10 and seen == ['{"job": "a"}\n']
    assert done.failure() == "stopped at its limit of 2 s"


def test_bad_usage_is_one_line_and_exit_2(tmp_path, capsys):
    assert gpu_session.main(["--out", str(tmp_path), "no_such_stage"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown stage 'no_such_stage'")
    assert gpu_session.main(["honest"]) == 2
    assert gpu_session.main(["--out", str(tmp_path), "all"]) == 2          # more stages than files come back
    assert "at most 7" in capsys.readouterr().err
    assert gpu_session.main(["--out", str(tmp_path), "honest"]) == 2       # no GPU here and no --dry-run
    assert "no GPU here" in capsys.readouterr().err


def test_the_docs_page_has_a_table_for_every_stage_and_a_row_for_every_job():
    text = PAGE.read_text()
    gpu = Session(out=Path("."), dry_run=False, deadline=0.0)
    for stage in gpu_session.STAGES.values():
        section = text.split(f"### {stage.name}\n", 1)
        assert len(section) == 2, f"{PAGE.name} has no '### {stage.name}' table"
        table = section[1].split("\n### ", 1)[0]
        assert "| job | " + " | ".join(col.title for col in stage.columns) in table, stage.name
        names = kernel_times.row_names(dry_run=False) if stage is kernels.STAGE else [j.name for j in stage.planned(gpu)]
        for name in names:
            assert f"| {name} |" in table, (stage.name, name)
