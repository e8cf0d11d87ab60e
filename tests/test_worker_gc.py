"""A run in the launching process (one process, a sweep's single-process points, a Ray actor) hides what existed
before it from the garbage collector while it trains, collects what it made, and leaves the process as it was."""
import gc
import weakref

from omegaconf import OmegaConf

from framework import worker


class Cycle:
    def __init__(self):
        self.me = self


def _tracked(obj) -> bool:
    """In a generation the collector scans (gc.get_objects lists none of the frozen ones)."""
    return any(o is obj for o in gc.get_objects())


def test_a_run_scans_only_what_it_made_and_unfreezes_afterwards(monkeypatch):
    before_run = Cycle()
    seen = {}

    def fake_run(cfg, run_dir, on_record, says_refusals):
        made = Cycle()
        seen["old_scanned"] = _tracked(before_run)
        seen["new_scanned"] = _tracked(made)
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(worker, "_run", fake_run)
    frozen_before = gc.get_freeze_count()
    worker.run_worker(OmegaConf.create({"trainer": {"deterministic": False},
                                        "checkpoint": {"storage_timeout_s": 60.0}}), "unused")
    assert seen == {"old_scanned": False, "new_scanned": True, "frozen": seen["frozen"]} and seen["frozen"] > 0
    assert gc.get_freeze_count() == frozen_before == 0 and _tracked(before_run)


def test_garbage_the_run_makes_is_collected_inside_it():
    with worker.collecting_only_what_the_run_makes():
        made = weakref.ref(Cycle())
        assert made() is not None         # a cycle: only the collector frees it
        gc.collect()
        assert made() is None


def test_a_forked_workers_frozen_objects_stay_frozen():
    """A worker forked from the fork server (which froze what it imported) keeps them out of sight."""
    old = Cycle()
    gc.freeze()
    try:
        with worker.collecting_only_what_the_run_makes():
            pass
        assert not _tracked(old) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
