"""Actions: what an alert can do besides paging. `runner.py` runs snapshot, rollback,
hot_reload, failover and collect (once per episode, within cooldowns and caps) against
the `ModelControl` seam, whoever decided (a rule, Alertmanager, a release check of
alerts/release/); `evidence.py` keeps the evidence (snapshots, data collections).

The public names are exported by `infersight.alerts`.
"""
