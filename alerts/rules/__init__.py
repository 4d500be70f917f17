"""Rules and their evaluation: the rule file, loaded and exported for Prometheus
(`config.py`), its rules and their YAML reading (`rules.py`), the signals a rule watches
and where their values come from (`signals.py`), SLOs, their burn rates and their ledger
(`slo.py`), and the evaluator that steps each alert and writes what its firing asks for
(`evaluator.py`).

The public names are exported by `infersight.alerts`.
"""
