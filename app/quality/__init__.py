"""Quality gates: eval suites that score a model through the gateway and decide whether it may be used.

suite.py reads a suite (YAML or JSON lines of cases, or a built-in name); score.py holds the scorers
(exact, contains, regex, number within a tolerance, a JSON Schema subset, a judge model with a rubric);
runner.py asks the model each case as an ordinary chat request and combines the weighted scores; store.py
keeps runs and their cases in SQLite (<home>/evals.db) for `switchyard eval --history` and `/api/evals`.
"""
