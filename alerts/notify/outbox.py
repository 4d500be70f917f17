"""The transactional outbox: a notification is a row written in the same transaction as
the alert state change that caused it, then claimed, delivered and marked by a dispatcher.

Claiming takes a lease: one `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)
RETURNING` (SQLite serialises the statement on its write lock), so two dispatchers never
hold the same row at once. A dispatcher killed mid-delivery leaves a lease that expires;
the row is delivered again under the same idempotency key (at-least-once).

A row holds one `Notification`: one alert group to one receiver. Its JSON is
Alertmanager's webhook payload (version "4") plus infersight's idempotency
key; each receiver renders it (PagerDuty event, signed webhook, Slack message) at send time.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infersight.monitor.store.tables import notification_log, outbox
from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update

__all__ = [
    "Notification",
    "NotifiedAlert",
    "OutboxEntry",
    "Status",
    "claim",
    "counts",
    "enqueue",
    "finish",
    "requeue_dead",
]


Status = Literal["firing", "resolved", "acknowledged"]  # acknowledged: still firing, now muted
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for alerts still firing


def _iso(t: dt.datetime | None) -> str:
    return _ZERO_TIME if t is None else t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class NotifiedAlert:
    status: Literal["firing", "resolved"]
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    starts_at: dt.datetime
    ends_at: dt.datetime | None
    fingerprint: str
    value: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": _iso(self.starts_at),
            "endsAt": _iso(self.ends_at),
            "generatorURL": "",
            "fingerprint": self.fingerprint,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NotifiedAlert:
        ends = obj["endsAt"]
        return cls(
            status=obj["status"],
            labels=tuple(sorted(obj["labels"].items())),
            annotations=tuple(sorted(obj["annotations"].items())),
            starts_at=dt.datetime.fromisoformat(obj["startsAt"]),
            ends_at=None if ends == _ZERO_TIME else dt.datetime.fromisoformat(ends),
            fingerprint=obj["fingerprint"],
            value=obj.get("value"),
        )


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = dict(maps[0])
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


@dataclass(frozen=True)
class Notification:
    idempotency_key: str  # stable across retries: webhook-id, Idempotency-Key
    group_key: str  # stable per alert group: PagerDuty dedup_key
    receiver: str
    status: Status  # firing when any alert of the group fires
    group_labels: tuple[tuple[str, str], ...]
    alerts: tuple[NotifiedAlert, ...]
    created_at: dt.datetime
    external_url: str = ""

    @property
    def common_labels(self) -> dict[str, str]:
        return _common([dict(a.labels) for a in self.alerts])

    @property
    def common_annotations(self) -> dict[str, str]:
        return _common([dict(a.annotations) for a in self.alerts])

    @property
    def firing(self) -> tuple[NotifiedAlert, ...]:
        return tuple(a for a in self.alerts if a.status == "firing")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": "4",
            "groupKey": self.group_key,
            "truncatedAlerts": 0,
            "status": self.status,
            "receiver": self.receiver,
            "groupLabels": dict(self.group_labels),
            "commonLabels": self.common_labels,
            "commonAnnotations": self.common_annotations,
            "externalURL": self.external_url,
            "alerts": [a.to_json() for a in self.alerts],
            "idempotencyKey": self.idempotency_key,
            "createdAt": _iso(self.created_at),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Notification:
        return cls(
            idempotency_key=obj["idempotencyKey"],
            group_key=obj["groupKey"],
            receiver=obj["receiver"],
            status=obj["status"],
            group_labels=tuple(sorted(obj["groupLabels"].items())),
            alerts=tuple(NotifiedAlert.from_json(a) for a in obj["alerts"]),
            created_at=dt.datetime.fromisoformat(obj["createdAt"]),
            external_url=obj.get("externalURL", ""),
        )


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
