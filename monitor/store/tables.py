"""Tables of the service: sampled requests, model versions, deploys, snapshots.

`requests` is a contract shared with drift (references from a time range of traffic)
and alerts (snapshots of the last N requests): change it only with docs/architecture.md.
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, String, Table, Text

from infersight.monitor.store.metadata import UTCDateTime, metadata

__all__ = ["requests"]

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
