"""The life of one alert, as Prometheus runs it: inactive → pending → firing → resolved,
and its `alerts` row (with its history) read and written inside a caller's transaction.

`step` is a pure function of the previous state, this evaluation's outcome and the
rule's `for` / `keep_firing_for`; the evaluator persists what it returns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from infersight.monitor.store.tables import alert_history, alerts
from sqlalchemy import Connection, delete, insert, select, update

__all__ = [
    "ActiveAlert",
    "AlertState",
    "Transition",
    "delete_alert",
    "episode_id",
    "fingerprint",
    "load_alerts",
    "push_alert",
    "record_transitions",
    "resolve_alert",
    "save_alert",
    "step",
]


AlertState = Literal["inactive", "pending", "firing", "resolved"]


def fingerprint(labels: Mapping[str, str]) -> str:
    """A stable id for a label set (alertname included)."""
    raw = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def episode_id(fp: str, active_at: dt.datetime) -> str:
    """One episode: from going pending (or firing) until resolved. Actions run once per episode."""
    return hashlib.sha256(f"{fp}@{active_at.isoformat()}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ActiveAlert:
    fingerprint: str
    rule_key: str | None
    alertname: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    state: AlertState
    value: float | None
    episode: str
    active_at: dt.datetime
    fired_at: dt.datetime | None = None
    keep_firing_since: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    ends_at: dt.datetime | None = None

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def annotation_dict(self) -> dict[str, str]:
        return dict(self.annotations)


@dataclass(frozen=True)
class Transition:
    fingerprint: str
    alertname: str
    episode: str
    from_state: AlertState
    to_state: AlertState
    value: float | None
    labels: tuple[tuple[str, str], ...]


def _seconds(a: dt.datetime, b: dt.datetime) -> float:
    return (a - b).total_seconds()


def step(
    prev: ActiveAlert | None,
    *,
    holds: bool,
    value: float | None,
    now: dt.datetime,
    for_s: float,
    keep_firing_for_s: float,
    new: ActiveAlert | None = None,
) -> tuple[ActiveAlert | None, list[tuple[AlertState, AlertState]]]:
    """The alert after one evaluation and the transitions taken. `new` is the pending alert
    to start when the condition holds and `prev` is absent or resolved (labels, annotations
    already rendered). A returned None means the alert is inactive and not kept."""
    moves: list[tuple[AlertState, AlertState]] = []
    cur = prev
    if holds:
        if cur is None or cur.state == "resolved":
            assert new is not None
            cur = dataclasses.replace(
                new, state="pending", active_at=now, episode=episode_id(new.fingerprint, now)
            )
            moves.append(("inactive", "pending"))
        elif new is not None:
            cur = dataclasses.replace(cur, annotations=new.annotations)
        cur = dataclasses.replace(cur, value=value, keep_firing_since=None)
        if cur.state == "pending" and _seconds(now, cur.active_at) >= for_s:
            cur = dataclasses.replace(cur, state="firing", fired_at=now)
            moves.append(("pending", "firing"))
        return cur, moves
    if cur is None or cur.state == "resolved":
        return cur, moves
    if cur.state == "pending":
        return None, [("pending", "inactive")]
    if keep_firing_for_s > 0:
        since = cur.keep_firing_since or now
        if _seconds(now, since) < keep_firing_for_s:
            return dataclasses.replace(cur, keep_firing_since=since), moves
    return dataclasses.replace(cur, state="resolved", resolved_at=now, keep_firing_since=None), [
        ("firing", "resolved")
    ]


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(json.loads(text).items()))


def from_row(row: Any) -> ActiveAlert:
    return ActiveAlert(
        fingerprint=row.fingerprint,
        rule_key=row.rule_key,
        alertname=row.alertname,
        labels=_pairs(row.labels),
        annotations=_pairs(row.annotations),
        state=row.state,
        value=row.value,
        episode=row.episode,
        active_at=row.active_at,
        fired_at=row.fired_at,
        keep_firing_since=row.keep_firing_since,
        resolved_at=row.resolved_at,
        ends_at=row.ends_at,
    )


def _values(a: ActiveAlert, now: dt.datetime) -> dict[str, Any]:
    return {
        "rule_key": a.rule_key,
        "alertname": a.alertname,
        "labels": json.dumps(dict(a.labels), sort_keys=True),
        "annotations": json.dumps(dict(a.annotations), sort_keys=True),
        "state": a.state,
        "value": a.value,
        "episode": a.episode,
        "active_at": a.active_at,
        "fired_at": a.fired_at,
        "keep_firing_since": a.keep_firing_since,
        "resolved_at": a.resolved_at,
        "ends_at": a.ends_at,
        "updated_at": now,
    }


def load_alerts(
    conn: Connection, *, rule_keys: Iterable[str] | None = None, states: Iterable[AlertState] | None = None
) -> dict[str, ActiveAlert]:
    q = select(alerts)
    if rule_keys is not None:
        q = q.where(alerts.c.rule_key.in_(list(rule_keys)))
    if states is not None:
        q = q.where(alerts.c.state.in_(list(states)))
    return {r.fingerprint: from_row(r) for r in conn.execute(q)}


def save_alert(conn: Connection, a: ActiveAlert, now: dt.datetime, *, exists: bool) -> None:
    if exists:
        conn.execute(update(alerts).where(alerts.c.fingerprint == a.fingerprint).values(**_values(a, now)))
    else:
        conn.execute(insert(alerts).values(fingerprint=a.fingerprint, **_values(a, now)))


def delete_alert(conn: Connection, fp: str) -> None:
    conn.execute(delete(alerts).where(alerts.c.fingerprint == fp))


def record_transitions(conn: Connection, transitions: Iterable[Transition], now: dt.datetime) -> None:
    rows = [
        {
            "fingerprint": t.fingerprint,
            "alertname": t.alertname,
            "episode": t.episode,
            "from_state": t.from_state,
            "to_state": t.to_state,
            "value": t.value,
            "labels": json.dumps(dict(t.labels), sort_keys=True),
            "at": now,
        }
        for t in transitions
    ]
    if rows:
        conn.execute(insert(alert_history), rows)


def push_alert(
    conn: Connection,
    alertname: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    *,
    now: dt.datetime,
    ends_at: dt.datetime,
    value: float | None = None,
) -> ActiveAlert:
    """Fire an alert raised by infersight itself (a failed action, a failed post-deploy
    analysis) until `ends_at`; pushing it again while it fires extends it. It is routed,
    grouped and notified like any rule's alert on the next `Evaluator.tick`."""
    full = {**labels, "alertname": alertname}
    fp = fingerprint(full)
    prev = _one(conn, fp)
    if prev is not None and prev.state == "firing":
        a = ActiveAlert(
            **{**prev.__dict__, "ends_at": ends_at, "annotations": tuple(sorted(annotations.items()))}
        )
        save_alert(conn, a, now, exists=True)
        return a
    a = ActiveAlert(
        fingerprint=fp,
        rule_key=None,
        alertname=alertname,
        labels=tuple(sorted(full.items())),
        annotations=tuple(sorted(annotations.items())),
        state="firing",
        value=value,
        episode=episode_id(fp, now),
        active_at=now,
        fired_at=now,
        ends_at=ends_at,
    )
    save_alert(conn, a, now, exists=prev is not None)
    record_transitions(
        conn, [Transition(fp, alertname, a.episode, "inactive", "firing", value, a.labels)], now
    )
    return a


def _one(conn: Connection, fp: str) -> ActiveAlert | None:
    row = conn.execute(select(alerts).where(alerts.c.fingerprint == fp)).first()
    return None if row is None else from_row(row)


def resolve_alert(conn: Connection, a: ActiveAlert, now: dt.datetime) -> ActiveAlert:
    done = ActiveAlert(**{**a.__dict__, "state": "resolved", "resolved_at": now})
    save_alert(conn, done, now, exists=True)
    return done
