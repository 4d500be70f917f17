"""Tables of the alert engine, on the one `infersight.monitor.store.metadata.metadata`.

Snapshots go to the store's shared `snapshots` table (monitor/store/tables.py).
JSON columns are Text holding `json.dumps` output (same on SQLite and PostgreSQL).
"""

from __future__ import annotations

from infersight.monitor.store.metadata import UTCDateTime, metadata
from sqlalchemy import Column, Float, Index, Integer, String, Table, Text

__all__ = [
    "action_runs",
    "alert_groups",
    "alert_history",
    "alerts",
    "deploy_analyses",
    "inbound_keys",
    "notification_log",
    "outbox",
    "silences",
]

# One row per alert (rule + label set, or pushed by infersight itself), kept while it is
# pending or firing and after it resolved until its groups have sent the resolve.
alerts = Table(
    "alerts",
    metadata,
    Column("fingerprint", String(32), primary_key=True),
    Column("rule_key", String(300)),  # None for alerts pushed by actions / analysis
    Column("alertname", String(256), nullable=False),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("state", String(16), nullable=False),  # pending, firing, resolved
    Column("value", Float),
    Column("episode", String(64), nullable=False),  # new each time it goes pending/firing again
    Column("active_at", UTCDateTime(), nullable=False),
    Column("fired_at", UTCDateTime()),
    Column("keep_firing_since", UTCDateTime()),  # first evaluation the condition was false while firing
    Column("resolved_at", UTCDateTime()),
    Column("ends_at", UTCDateTime()),  # pushed alerts resolve by themselves at ends_at
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_alerts_state", "state"),
)

alert_history = Table(
    "alert_history",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint", String(32), nullable=False),
    Column("alertname", String(256), nullable=False),
    Column("episode", String(64), nullable=False),
    Column("from_state", String(16), nullable=False),  # inactive, pending, firing
    Column("to_state", String(16), nullable=False),  # pending, firing, resolved, inactive
    Column("value", Float),
    Column("labels", Text, nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Index("ix_alert_history_at", "at"),
)

silences = Table(
    "alert_silences",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("matchers", Text, nullable=False),
    Column("starts_at", UTCDateTime(), nullable=False),
    Column("ends_at", UTCDateTime(), nullable=False),
    Column("created_by", String(256), nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

# Alertmanager's aggregation groups and their notification log (what was last sent).
alert_groups = Table(
    "alert_groups",
    metadata,
    Column("group_key", String(64), primary_key=True),
    Column("route", String(64), nullable=False),
    Column("receiver", String(256), nullable=False),
    Column("group_labels", Text, nullable=False),
    Column("members", Text, nullable=False),  # fingerprints
    Column("created_at", UTCDateTime(), nullable=False),
    Column("next_flush_at", UTCDateTime(), nullable=False),
    Column("last_notified_at", UTCDateTime()),
    Column("notified_firing", Text, nullable=False),
    Column("notified_resolved", Text, nullable=False),
    Column("seq", Integer, nullable=False),
)

outbox = Table(
    "alert_outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(64), nullable=False, unique=True),
    Column("receiver", String(256), nullable=False),
    Column("group_key", String(64), nullable=False),
    Column("payload", Text, nullable=False),  # a Notification as JSON; rendered per receiver at send time
    Column("state", String(16), nullable=False),  # pending, delivered, dead
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    Column("lease_owner", String(64)),
    Column("lease_until", UTCDateTime()),
    Column("last_status", Integer),
    Column("last_error", Text),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("delivered_at", UTCDateTime()),
    Index("ix_alert_outbox_due", "state", "next_attempt_at"),
)

notification_log = Table(
    "alert_notification_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("outbox_id", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("outcome", String(16), nullable=False),  # delivered, retried, dead
    Column("status", Integer),
    Column("error", Text),
    Column("duration_s", Float, nullable=False),
    Index("ix_alert_notification_log_outbox", "outbox_id"),
)

action_runs = Table(
    "alert_action_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_key", String(200), nullable=False, unique=True),  # action + episode: once per episode
    Column("action", String(32), nullable=False),
    Column("spec", Text, nullable=False),
    Column("trigger", String(32), nullable=False),  # rule, manual, alertmanager, analysis
    Column("alertname", String(256)),
    Column("labels", Text, nullable=False),
    Column("state", String(16), nullable=False),  # pending, succeeded, failed, refused, dry_run, dispatched
    Column("lease_owner", String(64)),
    Column("lease_until", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("before_version", String(256)),
    Column("after_version", String(256)),
    Column("detail", Text, nullable=False),
    # the replica whose runtime this run acts on (None: any; a model action with None is
    # fanned out to one row per replica serving the alerted version, state "dispatched")
    Column("replica", String(128)),
    Index("ix_alert_action_runs_recent", "action", "state", "started_at"),
)

# Inbound Alertmanager notifications already acted on: fingerprint + startsAt + status.
inbound_keys = Table(
    "alert_inbound_keys",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("alertname", String(256)),
    Column("received_at", UTCDateTime(), nullable=False),
)

deploy_analyses = Table(
    "alert_deploy_analyses",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("to_version", String(256), nullable=False),
    Column("from_version", String(256)),
    Column("deployed_at", UTCDateTime(), nullable=False),
    Column("ends_at", UTCDateTime(), nullable=False),
    Column("next_check_at", UTCDateTime(), nullable=False),
    Column("checks", Integer, nullable=False),
    Column("failed_checks", Integer, nullable=False),
    # running, passed, superseded, or by the rollback's outcome: rolled_back, rollback_failed, rollback_refused,
    # rollback_queued (to other replicas, whose runs in alert_action_runs say how it went)
    Column("state", String(16), nullable=False),
    Column("evidence", Text, nullable=False),  # the checks, as JSON
    Column("lease_owner", String(64)),  # the replica running a check now
    Column("lease_until", UTCDateTime()),
)
