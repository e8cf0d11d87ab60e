"""After a sharded build (framework/host_memory.returning_large_frees) glibc keeps freed heap memory for
the next step instead of trimming it and faulting it back in, every step (measured: a 3d tp2 job of
model=small took ~4,400 page faults a step with the heap trimmed, ~140 with it kept; a hand-written
DTensor loop ~2,100)."""
import resource

import torch

from framework.host_memory import returning_large_frees


def _page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_heap_memory_freed_by_a_step_is_reused_not_faulted_in_again():
    with returning_large_frees():
        pass
    torch.ones(1 << 20)                 # 4 MiB: under the mmap threshold, so from the heap
    before = _page_faults()
    for _ in range(20):
        torch.ones(1 << 20)             # each step's activations: allocated, touched, freed
    pages = 20 * (4 << 20) // resource.getpagesize()
    assert _page_faults() - before < pages // 10, (_page_faults() - before, pages)
