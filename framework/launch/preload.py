"""What the launcher's fork server imports once for all of a job's workers (launch/torch.py starts it), which
otherwise each import it again after the fork. A strategy declares what its own workers import
(`worker_preload`, a trait); this adds the rest."""
from __future__ import annotations

from typing import TYPE_CHECKING

from framework.evaluation.tasks import WORKER_MODULES as SCORING_MODULES

if TYPE_CHECKING:
    from framework.config.schema import Config

#: what every job's workers import, whatever the strategy (torch._dynamo: DDP and FSDP import it on their
#: first wrap, ~1 s of CPU in each worker)
FORK_SERVER_PRELOAD = ("framework.train.worker", "torch._dynamo")


def fork_server_preload(strategy_cls, cfg: Config) -> tuple[str, ...]:
    """What the launcher's fork server imports once for all of this job's workers, which otherwise each
    import it again after the fork (0.5-1.5 s of CPU a worker for DeepSpeed, pipelining, a transformers
    architecture, float8 or compile: 8 workers on 2 cores start seconds later): the strategy's modules,
    and on CPU also the strategy's and the model spec's own modules and what the model, float8 and compile
    import, and lm-eval where eval.tasks scores in the loop (on a GPU those are left to the workers: their imports
    are not known never to ask CUDA)."""
    from framework.models.spec import spec_for
    from framework.parallel import compile as compiling, float8
    from framework.runtime.devices import device_type
    if device_type(cfg) != "cpu":
        return strategy_cls.worker_preload(cfg)
    spec = spec_for(cfg.model)
    return (*strategy_cls.worker_preload(cfg), strategy_cls.__module__, type(spec).__module__,
            *spec.worker_modules(cfg.model), *float8.worker_modules(cfg.precision),
            *compiling.worker_modules(cfg.trainer), *(SCORING_MODULES if cfg.eval.tasks else ()))
