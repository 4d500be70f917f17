"""Rules and their evaluation: the rule file (`config.py`, `rules.py`, `_yaml.py`), the
signals a rule watches (`signals.py`) and where their values come from (`sources.py`),
SLOs and their burn rates (`slo.py`, `slo_ledger.py`), the evaluator that steps each
alert and writes what its firing asks for, and the Prometheus export (`promql.py`).

The public names are exported by `infersight.alerts`.
"""
