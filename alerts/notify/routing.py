"""Alertmanager's dispatch inside infersight: route firing alerts into aggregation groups,
flush each group after `group_wait`, then every `group_interval`, and notify only when
something changed (new firing alerts, newly resolved ones) or `repeat_interval` passed.
Silenced and inhibited alerts are left out. Every notification is written to the outbox
in the caller's transaction, the one that changed the alerts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from infersight.monitor.store.tables import alert_groups
from sqlalchemy import Connection, delete, insert, select, update

from ..lifecycle import ActiveAlert, delete_alert, load_alerts
from .matchers import InhibitRule, ReceiverConfig, Route, active_silences, inhibited, silenced_by
from .outbox import Notification, NotifiedAlert, Status, enqueue

__all__ = ["FlushResult", "Notifier", "RoutingConfig"]

RESOLVED_RETENTION = dt.timedelta(minutes=15)  # resolved alerts stay visible this long


@dataclass(frozen=True)
class FlushResult:
    group_key: str
    receiver: str
    notified: bool
    outbox_id: int | None
    firing: int
    resolved: int
    muted: int


def _group_labels(route: Route, labels: Mapping[str, str]) -> dict[str, str]:
    if "..." in route.group_by:
        return dict(labels)
    return {k: labels[k] for k in route.group_by if k in labels}


def _group_key(path: str, receiver: str, group_labels: Mapping[str, str]) -> str:
    raw = json.dumps([path, receiver, sorted(group_labels.items())], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _needs_update(
    notified_before: bool,
    prev_firing: set[str],
    prev_resolved: set[str],
    firing: set[str],
    resolved: set[str],
    send_resolved: bool,
    last: dt.datetime | None,
    repeat_s: float,
    now: dt.datetime,
) -> bool:
    """Alertmanager's DedupStage.needsUpdate."""
    if not notified_before:
        return bool(firing)
    if not firing <= prev_firing:
        return True
    if not firing:
        return bool(prev_firing)  # all resolved: clear the receiver's incident
    if send_resolved and not resolved <= prev_resolved:
        return True
    return last is None or (now - last).total_seconds() >= repeat_s


class RoutingConfig(Protocol):
    """What the notifier reads of a rule file (`AlertConfig` has it)."""

    @property
    def route(self) -> Route | None: ...
    @property
    def receivers(self) -> Mapping[str, ReceiverConfig]: ...
    @property
    def inhibit_rules(self) -> tuple[InhibitRule, ...]: ...


class Notifier:
    """Grouping, silencing, inhibition and dedup for one `AlertConfig`."""

    def __init__(self, config: RoutingConfig, *, external_url: str = "") -> None:
        self.config = config
        self.external_url = external_url
        self._routes: dict[str, Route] = {}
        if config.route is not None:
            self._index(config.route, "0")

    def _index(self, route: Route, path: str) -> None:
        self._routes[path] = route
        for i, child in enumerate(route.routes):
            self._index(child, f"{path}.{i}")

    def process(self, conn: Connection, now: dt.datetime) -> list[FlushResult]:
        """Group newly firing alerts, flush the groups that are due (in `conn`'s transaction)."""
        if self.config.route is None:
            self._forget_resolved(conn, now, referenced=set())
            return []
        alerts = load_alerts(conn, states=("firing", "resolved"))
        groups = {r.group_key: r for r in conn.execute(select(alert_groups))}
        for a in alerts.values():
            if a.state == "firing":
                self._add_to_groups(conn, a, groups, now)
        firing_labels = [a.label_dict() for a in alerts.values() if a.state == "firing"]
        silences = active_silences(conn, now)
        results = []
        for row in list(groups.values()):
            if row.next_flush_at <= now:
                results.append(self._flush(conn, row, alerts, firing_labels, silences, now))
        referenced: set[str] = set()
        for r in conn.execute(select(alert_groups.c.members)):
            referenced.update(json.loads(r.members))
        self._forget_resolved(conn, now, referenced)
        return results

    def _add_to_groups(
        self, conn: Connection, a: ActiveAlert, groups: dict[str, Any], now: dt.datetime
    ) -> None:
        assert self.config.route is not None
        labels = a.label_dict()
        for path, route in self.config.route.match(labels):
            glabels = _group_labels(route, labels)
            key = _group_key(path, route.receiver, glabels)
            row = groups.get(key)
            if row is None:
                values = {
                    "group_key": key,
                    "route": path,
                    "receiver": route.receiver,
                    "group_labels": json.dumps(glabels, sort_keys=True),
                    "members": json.dumps([a.fingerprint]),
                    "created_at": now,
                    "next_flush_at": now + dt.timedelta(seconds=route.group_wait_s),
                    "last_notified_at": None,
                    "notified_firing": "[]",
                    "notified_resolved": "[]",
                    "seq": 0,
                }
                conn.execute(insert(alert_groups).values(**values))
                groups[key] = conn.execute(select(alert_groups).where(alert_groups.c.group_key == key)).one()
            elif a.fingerprint not in json.loads(row.members):
                members = [*json.loads(row.members), a.fingerprint]
                conn.execute(
                    update(alert_groups)
                    .where(alert_groups.c.group_key == key)
                    .values(members=json.dumps(members))
                )
                groups[key] = conn.execute(select(alert_groups).where(alert_groups.c.group_key == key)).one()

    def _muted(
        self, a: ActiveAlert, firing_labels: list[dict[str, str]], silences: list[Any], now: dt.datetime
    ) -> bool:
        labels = a.label_dict()
        return silenced_by(labels, silences, now) is not None or inhibited(
            labels, firing_labels, self.config.inhibit_rules
        )

    def _flush(
        self,
        conn: Connection,
        row: Any,
        alerts: Mapping[str, ActiveAlert],
        firing_labels: list[dict[str, str]],
        silences: list[Any],
        now: dt.datetime,
    ) -> FlushResult:
        route = self._routes.get(row.route) or self.config.route
        assert route is not None
        receiver = self.config.receivers.get(row.receiver)
        members = [alerts[fp] for fp in json.loads(row.members) if fp in alerts]
        visible = [a for a in members if not self._muted(a, firing_labels, silences, now)]
        firing = {a.fingerprint for a in visible if a.state == "firing"}
        resolved = {a.fingerprint for a in visible if a.state == "resolved"}
        prev_firing, prev_resolved = (
            set(json.loads(row.notified_firing)),
            set(json.loads(row.notified_resolved)),
        )
        send_resolved = receiver.send_resolved if receiver is not None else True
        notify = _needs_update(
            row.last_notified_at is not None,
            prev_firing,
            prev_resolved,
            firing,
            resolved,
            send_resolved,
            row.last_notified_at,
            route.repeat_interval_s,
            now,
        )
        outbox_id, seq = None, row.seq
        values: dict[str, Any] = {}
        if notify:
            shown = [
                a for a in visible if a.state == "firing" or (send_resolved and a.fingerprint in resolved)
            ]
            status: Status = "firing" if firing else "resolved"
            still = [a for a in members if a.state == "firing" and a.fingerprint in prev_firing]
            if not firing and still:
                # what was paged still fires but is now silenced or inhibited: somebody owns it.
                # PagerDuty gets `acknowledge` (not `resolve`); other receivers have no such state.
                status, shown = "acknowledged", still
            n = self._notification(row, shown, status, now)
            wants = status != "acknowledged" or (receiver is not None and receiver.type == "pagerduty")
            if receiver is not None and receiver.enabled and wants:
                outbox_id = enqueue(conn, n, now)
            seq += 1
            values.update(
                last_notified_at=now,
                seq=seq,
                notified_firing=json.dumps(sorted(firing)),
                notified_resolved=json.dumps(sorted(resolved)),
            )
        remaining = [a.fingerprint for a in members if a.state == "firing"]
        if not remaining:
            conn.execute(delete(alert_groups).where(alert_groups.c.group_key == row.group_key))
        else:
            values.update(
                members=json.dumps(remaining),
                next_flush_at=now + dt.timedelta(seconds=route.group_interval_s),
            )
            conn.execute(
                update(alert_groups).where(alert_groups.c.group_key == row.group_key).values(**values)
            )
        return FlushResult(
            row.group_key,
            row.receiver,
            notify,
            outbox_id,
            len(firing),
            len(resolved),
            len(members) - len(visible),
        )

    def _notification(
        self, row: Any, shown: Iterable[ActiveAlert], status: Status, now: dt.datetime
    ) -> Notification:
        items = tuple(
            NotifiedAlert(
                status="firing" if a.state == "firing" else "resolved",
                labels=a.labels,
                annotations=a.annotations,
                starts_at=a.fired_at or a.active_at,
                ends_at=a.resolved_at if a.state == "resolved" else None,
                fingerprint=a.fingerprint,
                value=a.value,
            )
            for a in sorted(shown, key=lambda a: a.fingerprint)
        )
        key = hashlib.sha256(f"{row.group_key}:{row.seq}:{now.isoformat()}".encode()).hexdigest()[:32]
        return Notification(
            idempotency_key=key,
            group_key=row.group_key,
            receiver=row.receiver,
            status=status,
            group_labels=tuple(sorted(json.loads(row.group_labels).items())),
            alerts=items,
            created_at=now,
            external_url=self.external_url,
        )

    def _forget_resolved(self, conn: Connection, now: dt.datetime, referenced: set[str]) -> None:
        for a in load_alerts(conn, states=("resolved",)).values():
            if (
                a.fingerprint not in referenced
                and a.resolved_at is not None
                and now - a.resolved_at >= RESOLVED_RETENTION
            ):
                delete_alert(conn, a.fingerprint)
