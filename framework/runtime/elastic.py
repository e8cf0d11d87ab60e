"""Whether a worker group continues an earlier group of the same job, and so must resume, not start over.

torch's elastic agent restarts its workers after a failure (TORCHELASTIC_RESTART_COUNT grows) and also
when the membership changes, a node joining or leaving, where the count stays as it was. So each worker
also leaves a marker in the run dir under its agent's identity (host, agent pid, local rank): finding
its own marker means this agent started it before. The ranks then agree, since the workers of a node
that just joined are new while the others are not: if any rank continues, all do.
"""
from __future__ import annotations

import os
import socket
from functools import lru_cache

import torch
import torch.distributed as dist

MARKERS = ".agents"     # under the run dir


@lru_cache(maxsize=None)
def started_before(run_dir: str) -> bool:
    """Whether this worker's agent started a worker of this local rank in `run_dir` before (marks it now)."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return True
    if "TORCHELASTIC_RUN_ID" not in os.environ:      # no agent: nothing restarts this process
        return False
    marker = os.path.join(run_dir, MARKERS, f"{socket.gethostname()}_{os.getppid()}_{os.environ.get('LOCAL_RANK', '0')}")
    if os.path.exists(marker):
        return True
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    open(marker, "w").close()
    return False


def group_continues(run_dir: str, device: torch.device) -> bool:
    """Whether any rank of the group was started before by its agent (a collective where a group exists)."""
    mine = started_before(run_dir)
    if not dist.is_initialized():
        return mine
    flag = torch.tensor([int(mine)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
