"""`python -m tests.tools.import_graph [--static] [--calls]`, from the repository root: the package's shape as a
maintainer meets it.

Static, from the sources: the files and folders of framework/, its layers and their members (as
tests/structure/test_layering.py holds them), imports that point up a layer, and import circles (every import counts,
lazy ones inside functions too).

Dynamic, from running jobs (left out with --static): the journey of a job's config from the launcher's entry to the
worker's trainer (tests/tools/journey_trace.py records it): the modules that hold the config, in order, how many
distinct ones, the moves between them and the returns to a module already left. Two tiny jobs run, each from a
directory outside the checkout: one process (parallel=single), and parallel=ddp on two workers (the launcher's part,
then rank 0's from the moment it starts), and the deepest hand-on: the longest chain of modules that pass the config
down to one another. --calls also lists the calls that handed the config on."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.structure.test_layering import LAYER, LAYERS, _room

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "framework"
JOURNEY_SITE = Path(__file__).with_name("journey")
#: a job that trains one step of the tiny model, as cheaply as it can
TINY = ["model=tiny", "data.seq_len=32", "trainer.max_steps=1", "trainer.global_batch_size=4",
        "trainer.log_every=1", "trainer.eval_every=0", "trainer.progress_bar=false", "logging.trackers=[]",
        "checkpoint.enabled=false"]
JOBS = {"one process (parallel=single)": ["parallel=single"],
        "two workers (parallel=ddp)": ["parallel=ddp", "launcher.nproc_per_node=2"]}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The framework modules `path` imports (a name imported from a package is its submodule where one is)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    out = set()
    for name in found:
        while name and name not in known:       # `import framework.a.b` of a name inside a module
            name = name.rpartition(".")[0]
        if name.startswith("framework"):
            out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) - {name} for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    out = []
    for a, targets in edges.items():
        for b in targets:
            ra, rb = _room(a), _room(b)
            if ra and rb and ra != rb and ra != "__init__" and LAYER.get(rb, -1) > LAYER.get(ra, -1):
                out.append((a, b))
    return sorted(out)


def static_report() -> list[str]:
    found = modules()
    folders = {p.parent for p in found.values()}
    lines = sum(len(p.read_text().splitlines()) for p in found.values())
    roots = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    edges = graph()
    out = [f"framework/: {len(found)} Python files, {lines} lines, {len(folders)} folders (the package itself "
           f"included), {len(roots)} modules at its root: {', '.join(roots)}",
           f"layers (tests/structure/test_layering.py), lowest first: {len(LAYERS)}"]
    out += [f"  {i:>2}: {', '.join(sorted(rooms))}" for i, rooms in enumerate(LAYERS)]
    up = upward(edges)
    out.append(f"imports that point up a layer: {len(up)}")
    out += [f"  {a} -> {b}" for a, b in up]
    found_circles = circles(edges)
    out.append(f"import circles: {len(found_circles)}")
    out += [f"  {' <-> '.join(c)}" for c in found_circles]
    out.append(f"imports between modules: {sum(len(v) for v in edges.values())}")
    return out


def path_figures(path: list[str]) -> dict:
    """Distinct modules, moves between them and returns to a module already left, of a journey."""
    returns = sum(1 for i, m in enumerate(path) if m in path[:i])
    return {"modules": len(set(path)), "moves": max(0, len(path) - 1), "returns": returns}


def run_journey(overrides: list[str], folder: Path) -> list[dict]:
    """Run one job with the journey recorded; each traced process's record (the launcher's first)."""
    records = folder / "journey"
    records.mkdir(parents=True)
    env = {**os.environ, "FRAMEWORK_JOURNEY": str(records), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(JOURNEY_SITE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-m", "framework", *TINY, *overrides, f"hydra.run.dir={folder / 'run'}"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the job failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    found = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    launcher = [r for r in found if r["role"] == "launcher"]
    workers = sorted((r for r in found if r["role"] == "worker" and r["rank"] == 0), key=lambda r: r["rank"])
    return launcher + workers[:1]


def journey_report(show_calls: bool) -> list[str]:
    out = []
    for title, overrides in JOBS.items():
        with tempfile.TemporaryDirectory(prefix="journey-") as folder:
            records = run_journey(overrides, Path(folder))
        path, calls, deepest = [], [], []
        if len(records) == 2:       # the launcher's part ends where the worker's begins (one clock for both)
            launcher, worker = records
            launcher["path"] = [m for m, t in zip(launcher["path"], launcher["times"]) if t < worker["started"]]
        for record in records:
            for module in record["path"]:
                if not path or path[-1] != module:
                    path.append(module)
            calls += record["calls"]
            deepest = max(deepest, record.get("deepest", []), key=len)
        if not path or path[-1] != "framework.train.trainer":
            raise SystemExit(f"{title}: the config never reached the trainer: {path}")
        figures = path_figures(path)
        out.append(f"the config's journey, {title}: {figures['modules']} modules, {figures['moves']} moves between "
                   f"them, {figures['returns']} returns to a module already left; "
                   f"{' and '.join(r['role'] for r in records)}")
        out += [f"  {' -> '.join(m.removeprefix('framework.') for m in path)}"]
        out.append(f"  its deepest hand-on, {len(deepest)} modules (each passing the config down to the next): "
                   f"{' -> '.join(m.removeprefix('framework.') for m in deepest)}")
        if show_calls:
            out += [f"    {c}" for c in calls]
    return out


def main(argv: list[str]) -> None:
    print("\n".join(static_report()))
    if "--static" not in argv:
        print("\n".join(journey_report("--calls" in argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
