"""Silences as in Alertmanager: matchers and a time range; a silenced alert is not
notified. Expiring a silence sets its end to now; expired silences are kept for the record."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infersight.monitor.store.tables import silences
from sqlalchemy import Connection, Engine, insert, select, update

from ..errors import InvalidMatcher
from .matchers import Matcher, matches_all

__all__ = ["Silence", "active_silences", "create_silence", "expire_silence", "list_silences", "silenced_by"]

SilenceState = Literal["pending", "active", "expired"]


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: dt.datetime
    ends_at: dt.datetime
    created_by: str
    comment: str

    def state(self, now: dt.datetime) -> SilenceState:
        if now >= self.ends_at:
            return "expired"
        return "active" if now >= self.starts_at else "pending"

    def mutes(self, labels: Mapping[str, str], now: dt.datetime) -> bool:
        return self.state(now) == "active" and matches_all(self.matchers, labels)

    def to_json(self, now: dt.datetime) -> dict[str, object]:
        return {
            "id": self.id,
            "matchers": [m.to_json() for m in self.matchers],
            "startsAt": self.starts_at.isoformat(),
            "endsAt": self.ends_at.isoformat(),
            "createdBy": self.created_by,
            "comment": self.comment,
            "status": {"state": self.state(now)},
        }


def _from_row(r: Any) -> Silence:
    return Silence(
        id=r.id,
        matchers=tuple(Matcher.from_json(m) for m in json.loads(r.matchers)),
        starts_at=r.starts_at,
        ends_at=r.ends_at,
        created_by=r.created_by,
        comment=r.comment,
    )


def create_silence(
    engine: Engine,
    matchers: Sequence[Matcher],
    *,
    starts_at: dt.datetime,
    ends_at: dt.datetime,
    created_by: str,
    comment: str,
    now: dt.datetime,
) -> Silence:
    """A new silence; refused (InvalidMatcher) without matchers or with an empty time range."""
    if not matchers:
        raise InvalidMatcher("a silence needs at least one matcher")
    if all(m.op in ("=~", "!~", "!=") and m.matches({}) for m in matchers):
        raise InvalidMatcher(
            "a silence whose matchers all match the empty label set would silence everything"
        )
    if ends_at <= starts_at or ends_at <= now:
        raise InvalidMatcher("a silence must end after it starts and in the future")
    s = Silence(str(uuid.uuid4()), tuple(matchers), starts_at, ends_at, created_by, comment)
    with engine.begin() as conn:
        conn.execute(
            insert(silences).values(
                id=s.id,
                matchers=json.dumps([m.to_json() for m in s.matchers]),
                starts_at=starts_at,
                ends_at=ends_at,
                created_by=created_by,
                comment=comment,
                created_at=now,
            )
        )
    return s


def expire_silence(engine: Engine, silence_id: str, *, now: dt.datetime) -> bool:
    """End a silence now; False when it does not exist or has already expired."""
    with engine.begin() as conn:
        result = conn.execute(
            update(silences).where(silences.c.id == silence_id, silences.c.ends_at > now).values(ends_at=now)
        )
        return bool(result.rowcount)


def list_silences(engine: Engine, *, now: dt.datetime, include_expired: bool = False) -> list[Silence]:
    with engine.connect() as conn:
        q = select(silences).order_by(silences.c.created_at)
        if not include_expired:
            q = q.where(silences.c.ends_at > now)
        return [_from_row(r) for r in conn.execute(q)]


def active_silences(conn: Connection, now: dt.datetime) -> list[Silence]:
    q = select(silences).where(silences.c.starts_at <= now, silences.c.ends_at > now)
    return [_from_row(r) for r in conn.execute(q)]


def silenced_by(labels: Mapping[str, str], active: Sequence[Silence], now: dt.datetime) -> str | None:
    """The id of a silence muting `labels`, if any."""
    for s in active:
        if s.mutes(labels, now):
            return s.id
    return None
