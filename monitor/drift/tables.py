"""Tables of the drift module, defined on `infersight.monitor.store.metadata.metadata`.

- `drift_references`: a named, versioned reference window, tied to the model version it
  belongs to and to where it came from (a file, a time range of traffic, the first N
  requests after a deploy).
- `drift_reference_texts`: its texts, and their embeddings as little-endian float32 bytes.
  Texts are always kept (so a reference can be re-embedded with another model);
  embeddings are kept with the name of the model that made them because re-encoding a
  few thousand texts costs seconds of CPU on every restart, and 1.5 KB a text is cheap.
  They are used only when the detector's embedder has the same name.
- `drift_reference_lengths`: the token lengths of the requests of the reference's time
  span, every request and not only the sampled texts (prompt and output tokens; either
  may be missing), or of a file's records when it carries `prompt_tokens`. Kept with the
  reference because `requests` rows expire long before a reference does.
- `drift_reports`: every evaluation, its headline in columns (for lists and retention)
  and the full `DriftReport.to_json()` in `content`.
"""

from __future__ import annotations

from infersight.monitor.store.metadata import UTCDateTime, metadata
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = ["drift_reference_lengths", "drift_reference_texts", "drift_references", "drift_reports"]

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
