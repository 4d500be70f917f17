"""Label matchers as Alertmanager writes them, and the routing configuration built from
them: receivers, the routing tree (`Route.match`), and inhibit rules (`inhibited`).

Matchers: `severity="critical"`, `team!=ml`, `alertname=~"GPU.*"`, `model!~"test-.*"`
(regular expressions are fully anchored). They run on RE2 (google-re2), which
Alertmanager's Go regexp also implements: linear time in the label's length, so a silence
or route written by a user cannot stall the notifier (no catastrophic backtracking as with
Python's `re`).

Inhibition: a firing source alert mutes target alerts that share the values of the
`equal` labels (a missing label equals a missing label).

Silences as in Alertmanager: matchers and a time range; a silenced alert is not
notified. Expiring a silence sets its end to now; expired silences are kept for the record.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import re2
from infersight.monitor.store.tables import silences
from sqlalchemy import Connection, Engine, insert, select, update

from ..errors import InvalidMatcher

__all__ = [
    "DEFAULT_PAGERDUTY_URL",
    "InhibitRule",
    "Matcher",
    "ReceiverConfig",
    "ReceiverType",
    "Route",
    "Silence",
    "active_silences",
    "create_silence",
    "expire_silence",
    "inhibited",
    "list_silences",
    "matches_all",
    "parse_matcher",
    "silenced_by",
]


MatchOp = Literal["=", "!=", "=~", "!~"]
_FORM = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern becomes InvalidMatcher, not a line on stderr


@dataclass(frozen=True)
class Matcher:
    name: str
    op: MatchOp
    value: str
    _regex: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            try:
                regex = re2.compile(self.value, _RE2_OPTIONS)
            except re2.error as exc:
                reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
                raise InvalidMatcher(f"{self}: bad regular expression: {reason}") from exc
            object.__setattr__(self, "_regex", regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = self._regex.fullmatch(actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "op": self.op, "value": self.value}

    @classmethod
    def from_json(cls, obj: Mapping[str, str]) -> Matcher:
        op = obj.get("op", "=")
        if op not in ("=", "!=", "=~", "!~"):
            raise InvalidMatcher(f"unknown matcher operator {op!r}")
        return cls(str(obj["name"]), cast(MatchOp, op), str(obj["value"]))


def parse_matcher(text: str) -> Matcher:
    """`name op value`, value optionally in double quotes."""
    m = _FORM.fullmatch(text)
    if m is None:
        raise InvalidMatcher(f'not a matcher: {text!r} (expected e.g. severity="critical")')
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return Matcher(name, cast(MatchOp, op), value)


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


ReceiverType = Literal["pagerduty", "webhook", "slack"]
DEFAULT_PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


@dataclass(frozen=True)
class ReceiverConfig:
    """Where notifications go. `secret` is the PagerDuty routing key or the webhook's
    `whsec_...` signing secret. A receiver whose secret or URL comes from an unset
    environment variable is kept but `disabled_reason` says why nothing is sent."""

    name: str
    type: ReceiverType
    url: str
    secret: str | None = None
    send_resolved: bool = True
    timeout_s: float = 10.0
    source: str = "infersight"  # PagerDuty payload.source
    disabled_reason: str | None = None

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None


@dataclass(frozen=True)
class Route:
    receiver: str
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = ("alertname",)
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 14400.0
    continue_: bool = False
    routes: tuple[Route, ...] = ()

    def match(self, labels: Mapping[str, str], path: str = "0") -> Iterator[tuple[str, Route]]:
        """The routes an alert with `labels` goes to, depth first, as (path, route):
        the deepest matching child, else this route (Alertmanager's tree walk)."""
        if not matches_all(self.matchers, labels):
            return
        found = False
        for i, child in enumerate(self.routes):
            hits = list(child.match(labels, f"{path}.{i}"))
            if hits:
                found = True
                yield from hits
                if not child.continue_:
                    break
        if not found:
            yield path, self


@dataclass(frozen=True)
class InhibitRule:
    """Alerts matching `target_matchers` are muted while an alert matching
    `source_matchers` fires with the same values of the `equal` labels."""

    source_matchers: tuple[Matcher, ...]
    target_matchers: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


def inhibited(
    labels: Mapping[str, str],
    firing: Sequence[Mapping[str, str]],
    rules: Sequence[InhibitRule],
) -> bool:
    """Whether an alert with `labels` is muted by one of the `firing` alerts' label sets."""
    for rule in rules:
        if not matches_all(rule.target_matchers, labels):
            continue
        for source in firing:
            if source is labels or dict(source) == dict(labels):
                continue
            if not matches_all(rule.source_matchers, source):
                continue
            if all(source.get(name, "") == labels.get(name, "") for name in rule.equal):
                return True
    return False


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
