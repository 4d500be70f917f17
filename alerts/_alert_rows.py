"""Reading and writing `alerts` rows (and their history) inside a caller's transaction."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update

from .state import ActiveAlert, AlertState, Transition, episode_id, fingerprint
from .tables import alert_history, alerts

__all__ = ["delete_alert", "load_alerts", "push_alert", "record_transitions", "resolve_alert", "save_alert"]


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
