"""Tables of the service: sampled requests, model versions, deploys, snapshots.

`requests` is a contract shared with drift (references from a time range of traffic)
and alerts (snapshots of the last N requests): change it only with docs/architecture.md.
`snapshots` is written by the snapshot action (alerts) and by `POST /api/v1/snapshots`;
`model_versions` and `deploys` by the service's engine supervisor. `replicas` and
`replica_slots` are what each replica publishes for the others (monitor/service/replicas.py).
`dataset_collections` is written by the collect action (alerts) and `dataset_items` by the
service's collection job (monitor/dataset), which copies the next N matching requests.
"""

from __future__ import annotations

from infersight.monitor.store.metadata import UTCDateTime, metadata
from sqlalchemy import Column, Float, ForeignKey, Index, Integer, String, Table, Text

__all__ = [
    "dataset_collections",
    "dataset_items",
    "deploys",
    "model_versions",
    "replica_slots",
    "replicas",
    "requests",
    "snapshots",
]

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
    Index("ix_requests_version_time", "model_version", "started_at"),
    Index("ix_requests_started_at", "started_at"),
)
# The rows that carry a relevance score (the sampled, embedded ones: a few percent of
# traffic), by time, with what the relevance alert reads: that windowed mean is then an
# index-only scan of those rows, not a visit to every request of the window (20,000 events/s
# make 18 million rows in the default 15 minutes). Partial on both SQLite and PostgreSQL.
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
