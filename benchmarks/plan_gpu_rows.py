"""The planner against the measured H100 rows (tests/fixtures/h100_single_gpu.jsonl, the session
docs/benchmarks/h100.md describes, or the path given):
each row's planned peak memory and step time next to what the GPU measured. Static: no GPU needed.
`python benchmarks/plan_gpu_rows.py [ROWS.jsonl]`"""
import json
import os
import sys

from framework.plan.__main__ import plan_for

GIB = 1024 ** 3
DEFAULT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "h100_single_gpu.jsonl")


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def planned(row: dict):
    plan, _ = plan_for([*row["overrides"].split(), "planner.device=h100", "planner.gpus_per_node=1"])
    return plan


def main(path: str) -> None:
    print(f"{'row':<28}{'planned GiB':>12}{'measured':>10}{'ratio':>7}{'planned s':>11}{'measured':>10}{'ratio':>7}")
    for row in rows(path):
        plan = planned(row)
        mem = plan.per_rank_bytes["total"] / GIB
        print(f"{row['name']:<28}{mem:>12.1f}{row['peak_allocated_gib']:>10.1f}{mem / row['peak_allocated_gib']:>7.2f}"
              f"{plan.step_time_s:>11.3f}{row['step_s']:>10.3f}{plan.step_time_s / row['step_s']:>7.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
