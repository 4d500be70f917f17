"""Every table of infersight, on one SQLAlchemy `MetaData`: the schema Alembic migrates.

The shared tables (`requests` and its texts, snapshots, deploys, dataset collections), the
alert engine's (alerts, history, groups, outbox, silences, action runs, inbound keys,
deploy analyses) and drift's (references, reports). They live here, below every package
that uses them, so that the store never imports the packages that read and write them.
Change them only with docs/architecture.md and a migration.
JSON columns are Text holding `json.dumps` output (same on SQLite and PostgreSQL).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.sql.elements import ColumnElement

__all__ = [
    "BUCKET_S",
    "action_runs",
    "alert_groups",
    "alert_history",
    "alerts",
    "by_start",
    "dataset_collections",
    "dataset_items",
    "deploy_analyses",
    "deploys",
    "drift_reference_lengths",
    "drift_reference_texts",
    "drift_references",
    "drift_reports",
    "environments",
    "feedback",
    "inbound_keys",
    "metadata",
    "model_versions",
    "notification_log",
    "outbox",
    "replica_slots",
    "replicas",
    "requests",
    "silences",
    "snapshots",
    "started_in",
    "time_bucket",
]


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


# The time indexes of `requests` hold a coarse start time, not `started_at` itself. Calls
# arrive out of start order (each SDK sends its calls' batch after they finish, several
# senders interleave), so a batch indexed by `started_at` lands all over the last seconds of
# the index: hundreds of B-tree pages rewritten per commit, most of the write's cost
# (docs/benchmarks/ingest.md). Keyed by the bucket, equal keys sort by row id, so a
# batch appends at the end of the one or two buckets it spans. Queries bound the bucket as
# well as `started_at` (`started_in`) and order by both (`by_start`): the same rows, in the
# same order, since the bucket only grows with `started_at`.
BUCKET_S = 10
_BUCKET = dt.timedelta(seconds=BUCKET_S)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def time_bucket(at: dt.datetime) -> int:
    """The `started_bucket` of a request that started at `at` (exact: integer arithmetic on
    the microseconds that are stored)."""
    return (at.astimezone(dt.UTC) - _EPOCH) // _BUCKET


def _bucket_default(ctx: Any) -> int:
    # inserts through SQLAlchemy that give no bucket (tests, the demo); the writer gives it
    return time_bucket(ctx.get_current_parameters()["started_at"])


# One observed inference call (an InferenceRecord). Every call's timings are kept;
# `prompt`/`response` only for calls whose text was sampled.
requests = Table(
    "requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(256), nullable=False, unique=True),
    Column("model", String(256), nullable=False),
    Column("model_version", String(256), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("ttft_s", Float),
    Column("tpot_s", Float),
    Column("queue_s", Float),
    Column("prompt_tokens", Integer),
    Column("output_tokens", Integer),
    Column("error_type", String(256)),
    Column("prompt", Text),
    Column("response", Text),
    Column("source", String(16), nullable=False),
    Column("relevance", Float),  # prompt-response cosine, filled in by the drift module
    Column("path", String(16)),  # SLA routing's path (fast, standard); NULL without routing
    Column("system_prompt", Text),  # a chat's system messages (sampled like `prompt`), for the cache preload
    Column("max_tokens", Integer),  # the request's shape: its output budget, streamed or not, why it ended
    Column("stream", Boolean),
    Column("finish_reason", String(16)),
    # floor(started_at's epoch seconds / BUCKET_S), set on insert: what the time indexes
    # order by (see `started_in`)
    Column("started_bucket", BigInteger, nullable=False, default=_bucket_default),
    Index("ix_requests_version_bucket", "model_version", "started_bucket"),
    Index("ix_requests_started_bucket", "started_bucket"),
)


def started_in(
    since: dt.datetime | None = None, until: dt.datetime | None = None, *, until_inclusive: bool = False
) -> list[ColumnElement[bool]]:
    """The conditions for `requests` that started at or after `since` and before `until`
    (at or before, with `until_inclusive`): on `started_at`, and on the bucket that lets
    the time indexes find them."""
    c = requests.c
    cond: list[ColumnElement[bool]] = []
    if since is not None:
        cond += [c.started_bucket >= time_bucket(since), c.started_at >= since]
    if until is not None:
        cond += [
            c.started_bucket <= time_bucket(until),
            c.started_at <= until if until_inclusive else c.started_at < until,
        ]
    return cond


def by_start(*, newest_first: bool = False) -> tuple[ColumnElement[Any], ...]:
    """ORDER BY for `requests` by start time, ties by id, in the time indexes' order."""
    columns = (requests.c.started_bucket, requests.c.started_at, requests.c.id)
    return tuple(col.desc() for col in columns) if newest_first else columns


# The rows that carry a relevance score (the sampled, embedded ones: a few percent of
# traffic), by time, with what the relevance alert reads: that windowed mean is then an
# index-only scan of those rows, not a visit to every request of the window (a busy sidecar's
# traffic makes millions of rows in the default 15 minutes). Partial on both SQLite and PostgreSQL.
_HAS_RELEVANCE = requests.c.relevance.is_not(None)
Index(
    "ix_requests_relevance_time",
    requests.c.started_at,
    requests.c.model,
    requests.c.model_version,
    requests.c.relevance,
    sqlite_where=_HAS_RELEVANCE,
    postgresql_where=_HAS_RELEVANCE,
)

# A version the service knows of (mirrors the engine registry's VersionInfo).
model_versions = Table(
    "model_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(256), nullable=False, unique=True),
    Column("arch", String(64), nullable=False),
    Column("dataset", String(64), nullable=False),
    Column("quant", String(32), nullable=False),
    Column("major", Integer, nullable=False),
    Column("minor", Integer, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("parent", String(256)),
    Column("path", Text, nullable=False),
    Column("registered_at", UTCDateTime(), nullable=False),  # first seen by the service
)

# Every change of the serving version, and every refused deploy.
deploys = Table(
    "deploys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("from_version", String(256)),
    Column("to_version", String(256), nullable=False),
    Column("reason", String(64), nullable=False),  # start, deploy, rollback, failover, auto_rollback
    Column("outcome", String(32), nullable=False),  # deployed, refused, rolled_back
    Column("detail", Text),  # why (refusal reason, post-deploy evidence), free text
    Column("replica", String(128)),  # the service process whose runtime it was (replicas.id)
    Index("ix_deploys_at", "at"),
)

# An inference snapshot: the last N requests, metrics, drift report and version, kept
# as a row (its JSON in `content`) and as a file a person can open (`path`).
snapshots = Table(
    "snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("snapshot_id", String(64), nullable=False, unique=True),
    Column("taken_at", UTCDateTime(), nullable=False),
    Column("trigger", String(64), nullable=False),  # manual, alert, post_deploy
    Column("reason", Text, nullable=False),
    Column("model_version", String(256)),
    Column("request_count", Integer, nullable=False),
    Column("path", Text),
    Column("content", Text, nullable=False),  # JSON
    Index("ix_snapshots_taken_at", "taken_at"),
)

# A collection opened by the collect action: keep the next `n` requests (with text) that
# start at or after `created_at` and match `kind` (version: of `model_version`; failed:
# failed ones of any version; any: every request), for `infersight dataset export`.
dataset_collections = Table(
    "dataset_collections",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("collection_id", String(64), nullable=False, unique=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("kind", String(16), nullable=False),  # version, failed, any
    Column("model_version", String(256)),  # kind version: whose requests
    Column("n", Integer, nullable=False),
    Column("collected", Integer, nullable=False),
    Column("reason", Text, nullable=False),  # the alert (or trigger) that opened it
    Column("done_at", UTCDateTime()),  # set once `n` requests are kept
    Index("ix_dataset_collections_created_at", "created_at"),
)

# The requests a collection kept, copied: they outlive the `requests` table's retention.
dataset_items = Table(
    "dataset_items",
    metadata,
    Column(
        "collection_id",
        String(64),
        ForeignKey("dataset_collections.collection_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("request_id", String(256), primary_key=True),
    Column("model", String(256), nullable=False),
    Column("model_version", String(256), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("ttft_s", Float),
    Column("prompt_tokens", Integer),
    Column("output_tokens", Integer),
    Column("error_type", String(256)),
    Column("prompt", Text, nullable=False),
    Column("response", Text),
    Column("relevance", Float),
    Column("system_prompt", Text),
    Index("ix_dataset_items_version_time", "model_version", "started_at"),
)


# One row per running (or lately running) service process on this database: its
# heartbeat, the version its runtime serves, its queue depth by (model, version), and its
# latest GPU and process readings.
replicas = Table(
    "replicas",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("host", String(256), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("heartbeat_at", UTCDateTime(), nullable=False),
    Column("serving_version", String(256)),  # None: no embedded runtime (proxy or ingest only)
    Column("waiting", Text, nullable=False),  # JSON [[model, version, n], ...]
    Column("resources", Text, nullable=False),  # JSON {"gpus": [{index, uuid, ...}], "process": {...}}
    Column("leader", Boolean, nullable=False, server_default=false()),  # held the leader lock then
)

# One interval of one replica's sliding windows (collectors.SlotRecord): the alert engine
# merges the intervals of every replica.
replica_slots = Table(
    "replica_slots",
    metadata,
    Column("replica", String(128), primary_key=True),
    Column("model", String(256), primary_key=True),
    Column("model_version", String(256), primary_key=True),
    Column("slot", Integer, primary_key=True),  # floor(epoch seconds / interval_s)
    Column("interval_s", Float, nullable=False),
    Column("total", Integer, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("sketches", Text, nullable=False),  # JSON {metric: {"zero": n, "bins": [[key, count]...]}}
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_replica_slots_slot", "slot"),
)


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


drift_references = Table(
    "drift_references",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(256), nullable=False),
    Column("version", Integer, nullable=False),  # 1, 2, ... per name
    Column("model_version", String(256), nullable=False),
    Column("source", String(32), nullable=False),  # file, traffic, deploy
    Column("source_detail", Text),  # the path, or the time range / deploy time
    Column("created_at", UTCDateTime(), nullable=False),
    Column("embedder", String(256)),  # the model that made the stored embeddings
    Column("dimension", Integer),
    Column("n_texts", Integer, nullable=False),
    Column("n_responses", Integer, nullable=False),
    Column("fingerprint", String(64), nullable=False),  # sha256 of the texts
    UniqueConstraint("name", "version", name="uq_drift_references_name_version"),
    Index("ix_drift_references_model_version", "model_version"),
)

drift_reference_texts = Table(
    "drift_reference_texts",
    metadata,
    Column(
        "reference_id",
        Integer,
        ForeignKey("drift_references.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("position", Integer, primary_key=True),
    Column("prompt", Text, nullable=False),
    Column("response", Text),
    Column("prompt_embedding", LargeBinary),
    Column("response_embedding", LargeBinary),
)

drift_reference_lengths = Table(
    "drift_reference_lengths",
    metadata,
    Column(
        "reference_id",
        Integer,
        ForeignKey("drift_references.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("position", Integer, primary_key=True),
    Column("prompt_tokens", Integer),
    Column("output_tokens", Integer),
)

drift_reports = Table(
    "drift_reports",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("model", String(256)),
    Column("model_version", String(256)),
    Column("reference_id", Integer, ForeignKey("drift_references.id", ondelete="SET NULL")),
    Column("since", UTCDateTime()),
    Column("until", UTCDateTime()),
    Column("drifted", Boolean, nullable=False),
    Column("p_value", Float, nullable=False),
    Column("score", Float, nullable=False),
    Column("method", String(128), nullable=False),
    Column("n_reference", Integer, nullable=False),
    Column("n_current", Integer, nullable=False),
    Column("content", Text, nullable=False),  # DriftReport.to_json()
    Index("ix_drift_reports_created_at", "created_at"),
    Index("ix_drift_reports_version_time", "model_version", "created_at"),
)


# Users' feedback on a request, by its `request_id`: kept apart from `requests`, so that a
# request's own record is never altered and feedback may come before its request (joined
# when the request arrives, deleted when it never does within the feedback TTL).
feedback = Table(
    "feedback",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(256), nullable=False),
    Column("received_at", UTCDateTime(), nullable=False),
    Column("score", Float, nullable=False),  # 0..1, the given value normalised
    Column("given", String(32), nullable=False),  # the value as given: 0.7, up, 4/5
    Column("kind", String(64)),  # what was rated (helpfulness, accuracy...); None: overall
    Column("comment", Text),  # redacted, kept for the sampled share only
    Column("user", String(256)),
    Column("source", String(16), nullable=False),  # http, sdk, otlp
    Index("ix_feedback_request_id", "request_id"),
    Index("ix_feedback_received_at", "received_at"),
)

# The software a service process ran on, recorded at each start and deploy.
environments = Table(
    "environments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("taken_at", UTCDateTime(), nullable=False),
    Column("reason", String(16), nullable=False),  # start, deploy
    Column("replica", String(128)),
    Column("versions", Text, nullable=False),  # JSON {component: version}
    Column("fingerprint", String(64), nullable=False),  # sha256 of the versions
    Index("ix_environments_taken_at", "taken_at"),
)
