"""launcher.stop_grace_s: how long the launcher's elastic agent lets workers finish their step, agree, save
and exit after it passes a preemption signal on, before it SIGKILLs them."""
from torch.distributed.launcher.api import LaunchConfig

from framework.launch.torch import agent_options
from tests.harness.helpers import FAST, run_framework


def test_the_elastic_agent_waits_launcher_stop_grace_s_before_sigkill(compose_config):
    cfg = compose_config(["launcher.stop_grace_s=240.5"])
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, **agent_options(cfg))
    assert config.shutdown_timeout == 241
    assert compose_config([]).launcher.stop_grace_s >= 120     # torch's own 30 s is shorter than a large save


def test_a_non_positive_grace_is_refused(tmp_path):
    proc = run_framework([*FAST, "launcher.stop_grace_s=0"], tmp_path / "run")
    assert proc.returncode == 2 and proc.stderr.strip() == "error: launcher.stop_grace_s: must be positive, got 0.0"
