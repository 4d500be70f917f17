"""The `collect` action: after a rollback or a drift alert, keep the next N requests of the
drifted kind for export (`infersight dataset export --kind collected`).

It opens a row of the store's `dataset_collections`; the service's collection job
(monitor/dataset) then copies matching requests into `dataset_items` as they arrive, so
what was kept outlives the `requests` table's retention. Kinds:
- `version` (default): requests of the alerted version (its `model_version` label, else the
  serving one). Right for a drift alert on a version that keeps serving.
- `any`: every request, whatever serves it. Right after a rollback: the same traffic, now
  answered by the previous version, becomes a validation set for the next release.
- `failed`: requests that ended in an error, of any version.

Idempotent like the other actions: the runner runs an alert episode's action once, and the
collection's id is its run's, so a retried run never opens a second collection."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from infersight.monitor.store.tables import dataset_collections
from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from ..rules import COLLECT_KINDS

__all__ = ["CollectionOpened", "open_collection"]


@dataclass(frozen=True)
class CollectionOpened:
    collection_id: str
    kind: str
    model_version: str | None
    n: int
    created: bool  # False: this run had opened it already


def open_collection(
    engine: Engine,
    *,
    collection_id: str,
    kind: str,
    n: int,
    model_version: str | None,
    reason: str,
    now: dt.datetime,
) -> CollectionOpened:
    if kind not in COLLECT_KINDS or n < 1:
        raise ValueError(f"collect: kind must be one of {', '.join(COLLECT_KINDS)} and n positive")
    version = model_version if kind == "version" else None
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(dataset_collections).values(
                    collection_id=collection_id,
                    created_at=now,
                    kind=kind,
                    model_version=version,
                    n=n,
                    collected=0,
                    reason=reason,
                )
            )
    except IntegrityError:
        with engine.connect() as conn:
            row = conn.execute(
                select(dataset_collections).where(dataset_collections.c.collection_id == collection_id)
            ).one()
        return CollectionOpened(row.collection_id, row.kind, row.model_version, row.n, created=False)
    return CollectionOpened(collection_id, kind, version, n, created=True)
