"""Tools for maintainers, run from the repository root as `python -m tests.tools.<name>`."""
