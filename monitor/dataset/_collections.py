"""Filling the collections the `collect` action opens: each keeps (copies into
`dataset_items`) the next `n` requests with text that started at or after it was opened
and match its kind. Run by the service's leader on the sample interval, and by an export of
kind `collected` before it reads. Idempotent: an item is keyed by (collection, request), so
two fills never keep a request twice, and a full collection is closed (`done_at`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from infersight.monitor.store.tables import dataset_collections, dataset_items, requests
from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

__all__ = ["fill_collections"]

_COPIED = ("request_id", "model", "model_version", "started_at", "duration_s", "ttft_s", "prompt_tokens",
           "output_tokens", "error_type", "prompt", "response", "relevance", "system_prompt")  # fmt: skip


def fill_collections(engine: Engine, *, now: dt.datetime | None = None) -> int:
    """Copy what each open collection still lacks; the number of requests kept."""
    now = now or dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        open_ = conn.execute(select(dataset_collections).where(dataset_collections.c.done_at.is_(None))).all()
    return sum(_fill_one(engine, c, now) for c in open_)


def _fill_one(engine: Engine, c: Any, now: dt.datetime) -> int:
    cid: str = c.collection_id
    kept = select(dataset_items.c.request_id).where(dataset_items.c.collection_id == cid).scalar_subquery()
    cond = [
        requests.c.started_at >= c.created_at,
        requests.c.prompt.is_not(None),
        requests.c.request_id.not_in(kept),
    ]
    kind = c.kind
    if kind == "version":
        cond.append(requests.c.model_version == c.model_version)
    elif kind == "failed":
        cond.append(requests.c.error_type.is_not(None))
    try:
        with engine.begin() as conn:
            have = conn.execute(
                select(func.count()).select_from(dataset_items).where(dataset_items.c.collection_id == cid)
            ).scalar_one()
            want = int(c.n) - int(have)
            rows = []
            if want > 0:
                q = (
                    select(*(requests.c[k] for k in _COPIED))
                    .where(*cond)
                    .order_by(requests.c.started_at, requests.c.id)
                    .limit(want)
                )
                rows = [{**r._asdict(), "collection_id": cid} for r in conn.execute(q)]
            if rows:
                conn.execute(insert(dataset_items), rows)
            total = int(have) + len(rows)
            conn.execute(
                update(dataset_collections)
                .where(dataset_collections.c.collection_id == cid)
                .values(collected=total, done_at=now if total >= int(c.n) else None)
            )
    except IntegrityError:  # a concurrent fill kept the same request first: the next fill goes on
        return 0
    return len(rows)
