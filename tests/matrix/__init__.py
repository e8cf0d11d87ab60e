"""The combination matrix: every pair of options the config admits trains with parity, or is refused.

axes.py reads the options from the registries and crossed.py (what is crossed, what is not and why);
oracle.py asks the framework's own validation whether a job is admitted; cover.py picks a small set of jobs that covers every admitted pair;
run.py runs them (one Hydra multirun) with their single-process references and resumes; report.py prints
what was covered and writes the table docs/reference/combinations.md shows.
"""
