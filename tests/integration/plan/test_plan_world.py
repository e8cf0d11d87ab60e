"""How many GPUs a plan is for: planner.nodes counts whether or not planner.gpus_per_node is given."""
import json

import pytest

from framework.plan.check import planned_world
from framework.plan.hardware import device_named
from tests.harness.helpers import run_framework

H100 = device_named("h100")


@pytest.mark.parametrize("overrides,launcher_world,expected", [
    (["planner.nodes=32"], 8, (256, 8)),                                           # 8 per GPU node
    (["planner.nodes=4", "launcher.nproc_per_node=4"], 4, (16, 4)),                # the job's own per-node count
    (["planner.nodes=2", "planner.gpus_per_node=2", "launcher.nproc_per_node=4"], 4, (4, 2)),  # the planner's wins
    ([], 8, (8, 8)),                                                               # one node: the launcher's world
])
def test_planner_nodes_counts_without_gpus_per_node(compose_config, overrides, launcher_world, expected):
    cfg = compose_config(["model=tiny", *overrides])
    assert planned_world(cfg, launcher_world, H100) == expected


def test_the_issue_command_plans_for_32_nodes():
    proc = run_framework(["+recipe=llama3_70b", "data=synthetic", "planner.device=h100", "planner.nodes=32", "--json"],
                         module="framework.plan")
    assert proc.returncode == 0, proc.stderr[-2000:]     # was: world size 8 "not divisible by ... 32"
    assert json.loads(proc.stdout.strip().splitlines()[-1])["fits"]
