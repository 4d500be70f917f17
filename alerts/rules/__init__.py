"""Rules and their evaluation: the rule file (`config.py`, and `rules.py` with its YAML
reading), the signals a rule watches and where their values come from (`signals.py`),
SLOs, their burn rates and their ledger (`slo.py`), the evaluator that steps each
alert and writes what its firing asks for, and the Prometheus export (`promql.py`).

The public names are exported by `infersight.alerts`.
"""
