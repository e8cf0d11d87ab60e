"""torch's dynamic rendezvous (the c10d backend every local launch and elastic node uses) names each event it
records after the method that recorded it, found with `inspect.stack()`. That builds every frame's source
context and looks each frame's module up among all of sys.modules: with torch, transformers and DeepSpeed
loaded and Hydra's frames below, about 0.35 s of CPU a launch, paid again by every point of a sweep. The
same name is read from the frame itself."""
from __future__ import annotations

import sys


def _method_name(depth: int = 2) -> str:
    """What torch's get_method_name returns: the name of the function `depth` frames above this one."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:                  # a stack shallower than depth
        return "no_method_name"


def name_events_cheaply() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    if hasattr(dynamic_rendezvous, "get_method_name"):
        dynamic_rendezvous.get_method_name = _method_name
