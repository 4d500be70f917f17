"""The transactional outbox: a notification is a row written in the same transaction as
the alert state change that caused it, then claimed, delivered and marked by a dispatcher.

Claiming takes a lease: one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)
RETURNING` (SQLite serialises the statement on its write lock), so two dispatchers never
hold the same row at once. A dispatcher killed mid-delivery leaves a lease that expires;
the row is delivered again under the same idempotency key (at-least-once).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update

from .notification import Notification
from .tables import notification_log, outbox

__all__ = ["OutboxEntry", "claim", "counts", "enqueue", "finish", "requeue_dead"]

Outcome = Literal["delivered", "retried", "dead"]


@dataclass(frozen=True)
class OutboxEntry:
    id: int
    idempotency_key: str
    receiver: str
    payload: dict[str, Any]
    attempts: int  # attempts made before this one
    created_at: dt.datetime
    lease_owner: str

    @property
    def notification(self) -> Notification:
        return Notification.from_json(self.payload)


def enqueue(conn: Connection, n: Notification, now: dt.datetime) -> int | None:
    """Add `n` inside the caller's transaction; None when its key is already queued."""
    exists = conn.execute(select(outbox.c.id).where(outbox.c.idempotency_key == n.idempotency_key)).first()
    if exists is not None:
        return None
    result = conn.execute(
        insert(outbox).values(
            idempotency_key=n.idempotency_key,
            receiver=n.receiver,
            group_key=n.group_key,
            payload=json.dumps(n.to_json(), sort_keys=True),
            state="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )
    pk = result.inserted_primary_key
    return int(pk[0]) if pk is not None else None


def _claimable(now: dt.datetime) -> Any:
    return and_(
        outbox.c.state == "pending",
        outbox.c.next_attempt_at <= now,
        or_(outbox.c.lease_until.is_(None), outbox.c.lease_until < now),
    )


def claim(
    engine: Engine, owner: str, *, now: dt.datetime, lease_s: float, limit: int = 20
) -> list[OutboxEntry]:
    """Lease up to `limit` due rows to `owner` for `lease_s` seconds, oldest first."""
    due = (
        select(outbox.c.id)
        .where(_claimable(now))
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    stmt = (
        update(outbox)
        .where(outbox.c.id.in_(due.scalar_subquery()), _claimable(now))
        .values(lease_owner=owner, lease_until=now + dt.timedelta(seconds=lease_s))
        .returning(
            outbox.c.id,
            outbox.c.idempotency_key,
            outbox.c.receiver,
            outbox.c.payload,
            outbox.c.attempts,
            outbox.c.created_at,
        )
    )
    with engine.begin() as conn:
        rows = conn.execute(stmt).all()
    return sorted(
        (
            OutboxEntry(
                r.id, r.idempotency_key, r.receiver, json.loads(r.payload), r.attempts, r.created_at, owner
            )
            for r in rows
        ),
        key=lambda e: e.id,
    )


def finish(
    engine: Engine,
    entry: OutboxEntry,
    outcome: Outcome,
    *,
    now: dt.datetime,
    duration_s: float,
    status: int | None = None,
    error: str | None = None,
    next_attempt_at: dt.datetime | None = None,
) -> bool:
    """Record one attempt. Fenced by the lease: False (and nothing written) when another
    dispatcher took the row over after this one's lease expired."""
    values: dict[str, Any] = {
        "attempts": entry.attempts + 1,
        "last_status": status,
        "last_error": error,
        "lease_owner": None,
        "lease_until": None,
    }
    if outcome == "delivered":
        values.update(state="delivered", delivered_at=now)
    elif outcome == "dead":
        values.update(state="dead")
    else:
        assert next_attempt_at is not None
        values.update(next_attempt_at=next_attempt_at)
    with engine.begin() as conn:
        result = conn.execute(
            update(outbox)
            .where(
                outbox.c.id == entry.id,
                outbox.c.lease_owner == entry.lease_owner,
                outbox.c.state == "pending",
            )
            .values(**values)
        )
        if not result.rowcount:
            return False
        conn.execute(
            insert(notification_log).values(
                outbox_id=entry.id,
                attempt=entry.attempts + 1,
                at=now,
                outcome=outcome,
                status=status,
                error=error,
                duration_s=duration_s,
            )
        )
    return True


def counts(conn: Connection) -> dict[str, int]:
    """Rows per state: pending, delivered, dead."""
    rows = conn.execute(select(outbox.c.state, func.count()).group_by(outbox.c.state)).all()
    out = {"pending": 0, "delivered": 0, "dead": 0}
    out.update({state: int(n) for state, n in rows})
    return out


def requeue_dead(engine: Engine, *, now: dt.datetime, ids: list[int] | None = None) -> int:
    """Give dead letters another round of attempts (after fixing a receiver); returns how many."""
    stmt = update(outbox).where(outbox.c.state == "dead")
    if ids is not None:
        stmt = stmt.where(outbox.c.id.in_(ids))
    with engine.begin() as conn:
        return int(conn.execute(stmt.values(state="pending", attempts=0, next_attempt_at=now)).rowcount)
