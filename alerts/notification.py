"""One notification of one alert group to one receiver, as the outbox stores it.

Its JSON is Alertmanager's webhook payload (version "4") plus infersight's idempotency
key; each receiver renders it (PagerDuty event, signed webhook, Slack message) at send time.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Notification", "NotifiedAlert", "Status"]

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
