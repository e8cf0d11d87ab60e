"""`python -m tests.matrix [--write]`: compute the plan (from tests/matrix/plan.json, completed), print what it
covers and refuses; --write stores the plan and regenerates docs/reference/combinations.md."""
import sys

from tests.matrix import report
from tests.matrix.plan import current_plan, store
from tests.matrix.docs import write_docs

plan, _, seconds = current_plan()
print("\n".join(report.summary(plan, seconds)))
if "--write" in sys.argv[1:]:
    store(plan)
    write_docs(plan)
