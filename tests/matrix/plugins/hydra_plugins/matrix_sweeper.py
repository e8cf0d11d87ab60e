"""`hydra/sweeper=matrix`: Hydra's basic sweeper without its check that every point composes before the first
one runs. The matrix's points were composed, and checked by the framework, in the test process that planned
them (tests/matrix/oracle.py); Hydra's check composed all ~100 again, serially, before the first point
(~15 s). Each point is still composed by the launcher as in any sweep. On sys.path only in the matrix's sweep
(tests/matrix/run.py), under Hydra's plugin package as Hydra requires."""
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class PlannedSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch) -> None:
        pass
