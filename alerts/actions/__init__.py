"""Actions: what an alert can do besides paging. `runner.py` runs snapshot, rollback,
hot_reload, failover and collect (once per episode, within cooldowns and caps) against
the `ModelControl` seam; `evidence.py` keeps the evidence (snapshots, data collections);
`analysis.py` watches each deploy and rolls back a regression; `canary.py` runs a
candidate beside the stable version and promotes or rolls it back.

The public names are exported by `infersight.alerts`.
"""
