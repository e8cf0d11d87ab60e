"""Host memory while a sharded model is built: full-size temporaries must go back to the system.

A rank that builds its shards (FSDP materialise, DeepSpeed zero.Init) allocates each parameter's full
value, keeps its slice and frees the rest. glibc raises its mmap threshold after the first large free,
so later full-size temporaries come from the heap, and the holes left between the kept slices pin
them: measured on a ~98M-parameter Llama over 4 ranks, zero.Init's resident memory grew by 70% of the
full model instead of the 25% it keeps. Inside `returning_large_frees()` allocations above 1 MiB are
mapped and unmapped on their own; afterwards the threshold is fixed at glibc's dynamic maximum (what it
would have climbed to for a training step's tensors anyway). Elsewhere than glibc this does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DURING_BUILD = 1 << 20
AFTER_BUILD = 32 << 20      # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def returning_large_frees():
    libc = _libc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, DURING_BUILD):
        yield
        return
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, AFTER_BUILD)
        # Setting the mmap threshold switches off glibc's dynamic thresholds, the trim threshold's too:
        # left at its 128 KiB default, the heap is trimmed and grown again (page faults) every step.
        libc.mallopt(M_TRIM_THRESHOLD, 2 * AFTER_BUILD)
        libc.malloc_trim(0)
