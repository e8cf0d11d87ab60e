"""Creating the default process group so that a restarted group always finds its peers.

torch's elastic agent keeps ONE TCPStore for the whole job (the c10d rendezvous shares it across
rounds) and hands it to the workers with no per-attempt prefix. Every key the failed attempt wrote
(gloo's listening addresses, barrier counters, sub-group keys) is still there when the restarted
group starts, so a fast rank could read a dead peer's address and fail with "Connection refused", or
connect to whatever now listens on that port and hang. Each attempt therefore gets its own namespace
in the store. Every collective also gets a bounded timeout (`launcher.timeout_s`), so a peer that
died or hangs makes the others raise instead of waiting forever.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def attempt_namespace() -> str:
    """Store prefix unique to this job and this restart attempt."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"framework/{run_id}/attempt_{attempt}"


def _agent_store(timeout: timedelta) -> dist.Store | None:
    """The elastic agent's store, in a namespace of this attempt; None when no agent hosts one."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(attempt_namespace(), store)


def default_timeouts(timeout_s: float) -> timedelta:
    """Groups made later (DeviceMesh dims, DeepSpeed's, our async-save group) take the backend's module-level
    default, not the world group's timeout: make that default ours too."""
    timeout = timedelta(seconds=timeout_s)
    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = timeout
    if isinstance(c10d.default_pg_nccl_timeout, timedelta):
        c10d.default_pg_nccl_timeout = timeout
    return timeout


def init_default_group(backend: str, device: torch.device, timeout_s: float) -> None:
    """init_process_group from the launcher's environment, with a per-attempt store and a timeout."""
    timeout = default_timeouts(timeout_s)
    kwargs = dict(backend=backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    store = _agent_store(timeout)
    if store is not None:
        kwargs.update(store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    dist.init_process_group(**kwargs)
