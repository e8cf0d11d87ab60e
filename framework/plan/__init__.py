"""The planner: what a job needs per rank (memory, communication, pipeline bubble, step time) from the
config alone, before any process, weight or device exists. `python -m framework.plan <overrides>`."""
