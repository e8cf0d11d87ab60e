"""tests/tools/import_graph.py's own arithmetic: the circles it finds and the figures of a journey."""
from tests.tools.import_graph import circles, path_figures, static_report


def test_circles_are_the_strongly_connected_modules():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_a_journey_counts_its_moves_and_returns():
    assert path_figures(["launch", "validate", "launch", "worker", "trainer"]) == \
        {"modules": 4, "moves": 4, "returns": 1}


def test_the_package_as_measured_has_no_circle_and_no_upward_import():
    report = static_report()
    assert "imports that point up a layer: 0" in report and "import circles: 0" in report
