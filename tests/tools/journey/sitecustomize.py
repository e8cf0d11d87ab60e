"""Test-only: loaded into every process of a job when this directory is on PYTHONPATH and FRAMEWORK_JOURNEY names a
folder (tests/tools/import_graph.py sets both); inert otherwise. It follows the job's config through the framework's
calls (tests/tools/journey_trace.py) and writes each process's journey into that folder."""
import os

if os.environ.get("FRAMEWORK_JOURNEY"):
    from tests.tools import journey_trace
    journey_trace.install(os.environ["FRAMEWORK_JOURNEY"])
