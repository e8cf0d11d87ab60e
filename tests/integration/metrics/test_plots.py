"""The pictures: `python -m framework.compare` of a sweep and `python -m framework.plan ... --plot`, run as the
docs show them (docs/how-to/sweeps.md, docs/concepts/planner.md) from a directory other than the checkout;
each PNG is opened and checked for its size and for what is drawn in it."""
import os
import shlex
import sys

import pytest

from framework import compare
from tests.harness.docs_commands import block_of, environment, run_by
from tests.harness.helpers import REPO, check_ok, run_in_own_session

# the sweep's points, shortened: 3 logged steps each draw a curve (2 would be one point)
SHORTEN = ["trainer.max_steps=3", "trainer.log_every=1", "trainer.eval_batches=1", "trainer.progress_bar=false"]
TAB_COLORS = {"blue": (31, 119, 180), "orange": (255, 127, 14), "green": (44, 160, 44)}


def drawn(path, width: int, height: int) -> dict[str, int]:
    """Checks a PNG of at least width x height that is not blank; returns how many pixels hold each of
    matplotlib's first colors (what the curves and bars are drawn in)."""
    from PIL import Image
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width >= width and image.height >= height, image.size
        pixels = image.convert("RGB")
        colors = pixels.getcolors(maxcolors=image.width * image.height)
    assert len(colors) > 50, "a blank picture"
    white = sum(n for n, rgb in colors if rgb == (255, 255, 255))
    assert white < 0.97 * image.width * image.height, "next to nothing drawn"
    by_rgb = {rgb: n for n, rgb in colors}
    return {name: by_rgb.get(rgb, 0) for name, rgb in TAB_COLORS.items()}


def _run(command, cwd, extra=()) -> str:
    """A docs Command in README's environment plus its page's extras."""
    args = shlex.split(command.text)
    proc = run_in_own_session([sys.executable, *args[1:], *extra], cwd=cwd, timeout=600,
                              env={**os.environ, "PYTHONUNBUFFERED": "1",
                                   **environment(command, {"PYTHONPATH": str(REPO)})})
    check_ok(proc)
    return proc.stdout


def test_compare_plots_the_docs_sweep_side_by_side(tmp_path):
    (compare_command,) = [c for c in run_by(__file__) if c.text.startswith("python -m framework.compare ")]
    lines = block_of(compare_command)
    assert [c.text for c in run_by(__file__) if "lr_sweep" in c.text] == lines, "the sweep and its plot, in one block"
    for line in lines:
        command = next(c for c in run_by(__file__) if c.text == line)
        out = _run(command, tmp_path, SHORTEN if line.startswith("python -m framework ") else ())
    summary = out.splitlines()
    assert summary[-1] == "wrote lr_sweep.png"
    labels = [line.split(":")[0] for line in summary[:-1]]     # each point by the override that sets it apart
    assert len(set(labels)) == 2 and all(label.startswith("optimizer.lr=") for label in labels), out
    colors = drawn(tmp_path / "lr_sweep.png", 1000, 400)
    assert colors["blue"] > 200 and colors["orange"] > 200, f"both runs' curves drawn: {colors}"


def test_plan_plots_the_memory_and_time_of_the_docs_plan(tmp_path):
    (command,) = [c for c in run_by(__file__) if "--plot " in c.text]
    out = _run(command, tmp_path)
    assert "per-rank memory" in out
    picture = tmp_path / command.text.split("--plot ")[1].split()[0]
    colors = drawn(picture, 900, 500)
    assert min(colors.values()) > 200, f"params, grads and optimizer states drawn as bars: {colors}"


@pytest.mark.parametrize("case", ["missing", "not_json"])
def test_compare_refuses_what_is_not_a_run_in_one_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    run.mkdir()
    if case == "not_json":
        (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n')
    assert compare.main([str(run), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {run}") and not (tmp_path / "x.png").exists()
