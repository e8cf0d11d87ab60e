import pytest

from tests.helpers import FAST, check_ok, losses, run_framework

_references: dict[tuple, list[float]] = {}


@pytest.fixture(scope="session")
def single_reference(tmp_path_factory):
    """Losses of parallel=single on FAST plus extra args, computed once per distinct args."""
    def get(*extra: str) -> list[float]:
        key = tuple(extra)
        if key not in _references:
            run_dir = tmp_path_factory.mktemp("single")
            check_ok(run_framework([*FAST, "parallel=single", *extra], run_dir))
            _references[key] = losses(run_dir)
        return _references[key]
    return get
