"""Where the matrix's tables live in the docs: the whole of docs/reference/combinations.md, and README's strategy
table between its markers."""
from __future__ import annotations

from tests.harness.helpers import REPO
from tests.matrix import report
from tests.matrix.cover import Plan

PAGE = REPO / "docs" / "reference" / "combinations.md"
README = REPO / "README.md"
START, END = "<!-- combinations:start -->", "<!-- combinations:end -->"


def readme_with(plan: Plan, text: str) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{report.strategy_table(plan)}{END}{tail}"


def write_docs(plan: Plan) -> None:
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(report.pairs_page(plan))
    text = README.read_text()
    if START in text:
        README.write_text(readme_with(plan, text))
