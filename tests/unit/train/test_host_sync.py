"""No host-device synchronisation in a step that does not log (issue 13, item 4). Every read of a
tensor's value on the host (.item(), float(), int(), bool()) goes through aten._local_scalar_dense, which
is where a GPU makes the CPU wait. A step that logs reads its loss and grad norm; a step that does not
reads nothing, except the optimizer's own step counters (host tensors on a GPU too)."""
import torch
from hydra import compose, initialize_config_dir
from torch.utils._python_dispatch import TorchDispatchMode

from framework.config.paths import CONFIG_DIR
from framework.launch import admission
from framework.compose.config_store import register_configs
from framework.metrics.profile import StepProfiler
from framework.train.trainer import Trainer
from tests.harness.helpers import FAST, read_metrics


class ScalarReads(TorchDispatchMode):
    def __init__(self, ignored):
        super().__init__()
        self.ignored = ignored      # storages whose reads do not count
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and \
                args[0].untyped_storage().data_ptr() not in self.ignored():
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_step_that_does_not_log_never_reads_a_tensor_on_the_host(tmp_path, monkeypatch):
    trainers = []
    monkeypatch.setattr(Trainer, "__init__", lambda self, *a, _init=Trainer.__init__: (trainers.append(self),
                                                                                          _init(self, *a))[1])

    def optimizer_steps():
        optimizer = trainers[0].strategy.optimizer if trainers and hasattr(trainers[0].strategy, "optimizer") else None
        if optimizer is None:
            return set()
        return {s["step"].untyped_storage().data_ptr() for s in optimizer.state.values() if "step" in s}

    reads = ScalarReads(optimizer_steps)
    at_step = {}
    before = StepProfiler.before_step
    monkeypatch.setattr(StepProfiler, "before_step", lambda self, step: (at_step.setdefault(step, reads.count),
                                                                         before(self, step))[1])
    register_configs()
    overrides = [a for a in FAST if not a.startswith("trainer.log_every")] + ["trainer.log_every=4",
                                                                              "trainer.grad_clip=0.5"]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("config", overrides=overrides)
    with reads:
        admission.run(cfg, str(tmp_path / "run"))
    logged = [r["step"] for r in read_metrics(tmp_path / "run")]
    assert logged == [1, 4, 8]
    per_step = {step: at_step[step + 1] - at_step[step] for step in range(1, 8)}
    assert all(per_step[step] == 0 for step in (2, 3, 5, 6, 7)), per_step
    # the reads are there where the step logs: the test can see them
    assert per_step[1] > 0 and per_step[4] > 0, per_step
