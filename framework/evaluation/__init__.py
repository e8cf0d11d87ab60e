"""Benchmark scores through lm-evaluation-harness: the TemplateLM over a framework model (harness.py), the
per-token log-probabilities every strategy serves (scoring.py), the tasks and their offline setting (tasks.py),
the scores as records and a table (scores.py), the shipped offline tasks (shipped/) and the config's rules
(rules.py). lm_eval (the `eval` extra) is imported only where an evaluation runs."""
