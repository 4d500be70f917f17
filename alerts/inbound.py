"""Inbound Alertmanager webhooks (payload version "4"): teams that alert in Prometheus
trigger infersight's actions by label, e.g. `infersight_action="rollback"`.

The whole payload is validated before anything runs (`InvalidAlertmanagerPayload` names
the field). Each alert's idempotency key is fingerprint + startsAt + status, so the same
notification re-sent by Alertmanager or by its HA peers is recognised, and the action's
run key (fingerprint + startsAt: one per episode) makes sure nothing runs twice.

The FastAPI router that mounts it is in inbound_router.py, apart because FastAPI is the
service's dependency, not the alert engine's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infersight.monitor.store.tables import inbound_keys
from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from .actions.runner import ActionOutcome, ActionRunner
from .errors import InvalidAlertmanagerPayload
from .rules.rules import ACTION_TYPES, ActionSpec

__all__ = ["ACTION_LABEL", "AlertmanagerHandler", "InboundAlert", "InboundResult", "parse_payload"]


ACTION_LABEL = "infersight_action"
_PARAM_LABELS = {
    "infersight_version": "version",
    "infersight_backup": "backup",
    "infersight_requests": "requests",
}


@dataclass(frozen=True)
class InboundAlert:
    status: str
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    starts_at: str
    ends_at: str
    fingerprint: str
    action: ActionSpec | None

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.fingerprint}|{self.starts_at}|{self.status}".encode()).hexdigest()[:32]

    @property
    def episode(self) -> str:
        return hashlib.sha256(f"am|{self.fingerprint}|{self.starts_at}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class InboundResult:
    group_key: str
    received: int
    duplicates: int
    actions: tuple[ActionOutcome, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "groupKey": self.group_key,
            "received": self.received,
            "duplicates": self.duplicates,
            "actions": [a.to_json() for a in self.actions],
        }


def _str_map(obj: Any, field: str, *, required: bool = True) -> dict[str, str]:
    if obj is None and not required:
        return {}
    if not isinstance(obj, dict):
        raise InvalidAlertmanagerPayload(field, "must be an object of strings")
    for k, v in obj.items():
        if not isinstance(v, str):
            raise InvalidAlertmanagerPayload(f"{field}.{k}", "must be a string")
    return dict(obj)


def _time(value: Any, field: str) -> str:
    """The time in one canonical spelling (UTC, microseconds), so that `...00Z` and
    `...00.000Z` for the same instant give the same idempotency key."""
    if not isinstance(value, str):
        raise InvalidAlertmanagerPayload(field, "must be an RFC 3339 time string")
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        # Alertmanager may send nanoseconds, which fromisoformat refuses: trim them.
        head, _, tail = value.partition(".")
        digits = "".join(c for c in tail if c.isascii() and c.isdigit())
        zone = tail[len(digits) :]
        try:
            t = dt.datetime.fromisoformat(f"{head}.{digits[:6] or '0'}{zone}".replace("Z", "+00:00"))
        except ValueError:
            raise InvalidAlertmanagerPayload(field, f"not an RFC 3339 time: {value!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    try:
        return t.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    except OverflowError:  # 0001-01-01T00:00:00+01:00 has no UTC spelling
        raise InvalidAlertmanagerPayload(field, f"out of range: {value!r}") from None


def _action(labels: Mapping[str, str], field: str) -> ActionSpec | None:
    name = labels.get(ACTION_LABEL)
    if name is None:
        return None
    if name not in ACTION_TYPES:
        raise InvalidAlertmanagerPayload(
            f"{field}.{ACTION_LABEL}", f"unknown action {name!r}; valid: {', '.join(ACTION_TYPES)}"
        )
    params: list[tuple[str, str | int]] = []
    for label, param in _PARAM_LABELS.items():
        if label in labels:
            raw = labels[label]
            if param != "requests":
                params.append((param, raw))
            elif raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 10_000:  # "²".isdigit() too
                params.append((param, int(raw)))
            else:
                raise InvalidAlertmanagerPayload(f"{field}.{label}", "must be an integer in 1..10000")
    if name == "hot_reload" and "infersight_version" not in labels:
        raise InvalidAlertmanagerPayload(
            f"{field}.infersight_version", "hot_reload needs the version to deploy"
        )
    return ActionSpec(
        name, tuple(sorted(params)), dry_run=labels.get("infersight_dry_run", "false").lower() == "true"
    )


def parse_payload(body: Any) -> tuple[str, list[InboundAlert]]:
    """(groupKey, alerts) of a valid version-4 payload; raises InvalidAlertmanagerPayload."""
    if not isinstance(body, dict):
        raise InvalidAlertmanagerPayload("body", "must be a JSON object")
    if body.get("version") != "4":
        raise InvalidAlertmanagerPayload("version", f'must be "4", got {body.get("version")!r}')
    for key in ("groupKey", "receiver"):
        if not isinstance(body.get(key), str):
            raise InvalidAlertmanagerPayload(key, "must be a string")
    if body.get("status") not in ("firing", "resolved"):
        raise InvalidAlertmanagerPayload("status", "must be firing or resolved")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        _str_map(body.get(key), key, required=key == "groupLabels")
    raw = body.get("alerts")
    if not isinstance(raw, list) or not raw:
        raise InvalidAlertmanagerPayload("alerts", "must be a non-empty list")
    out = []
    for i, a in enumerate(raw):
        f = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise InvalidAlertmanagerPayload(f, "must be an object")
        if a.get("status") not in ("firing", "resolved"):
            raise InvalidAlertmanagerPayload(f"{f}.status", "must be firing or resolved")
        labels = _str_map(a.get("labels"), f"{f}.labels")
        if not isinstance(a.get("fingerprint"), str) or not a["fingerprint"]:
            raise InvalidAlertmanagerPayload(f"{f}.fingerprint", "must be a non-empty string")
        out.append(
            InboundAlert(
                status=a["status"],
                labels=tuple(sorted(labels.items())),
                annotations=tuple(
                    sorted(_str_map(a.get("annotations"), f"{f}.annotations", required=False).items())
                ),
                starts_at=_time(a.get("startsAt"), f"{f}.startsAt"),
                ends_at=_time(a.get("endsAt"), f"{f}.endsAt"),
                fingerprint=a["fingerprint"],
                action=_action(labels, f"{f}.labels"),
            )
        )
    return body["groupKey"], out


class AlertmanagerHandler:
    def __init__(
        self, engine: Engine, runner: ActionRunner, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.engine = engine
        self.runner = runner
        self.clock = clock

    def _seen(self, key: str) -> bool:
        with self.engine.connect() as conn:
            return (
                conn.execute(select(inbound_keys.c.key).where(inbound_keys.c.key == key)).first() is not None
            )

    def _remember(self, a: InboundAlert) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(inbound_keys).values(
                        key=a.key,
                        fingerprint=a.fingerprint,
                        status=a.status,
                        alertname=dict(a.labels).get("alertname"),
                        received_at=dt.datetime.fromtimestamp(self.clock(), dt.UTC),
                    )
                )
        except IntegrityError:
            pass  # an HA peer's copy got here first: same key, same outcome

    def handle(self, body: Any) -> InboundResult:
        group_key, alerts = parse_payload(body)
        duplicates, outcomes = 0, []
        for a in alerts:
            if self._seen(a.key):
                duplicates += 1
                continue
            if a.status == "firing" and a.action is not None:
                labels = dict(a.labels)
                outcome = self.runner.run(
                    a.action,
                    trigger="alertmanager",
                    key=a.episode,
                    alertname=labels.get("alertname"),
                    labels=labels,
                )
                outcomes.append(outcome)
                if outcome.duplicate:
                    duplicates += 1
            self._remember(a)
        return InboundResult(group_key, len(alerts), duplicates, tuple(outcomes))
