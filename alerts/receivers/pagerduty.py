"""PagerDuty Events API v2: one event per notification of an alert group.

`dedup_key` is the group key, stable for the group's lifetime, so a repeat trigger
updates the open incident and a resolve closes it. Receivers answer 202; 400 is a bad
event (not retried), 429 and 5xx are retried.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ..matchers import ReceiverConfig
from ..notification import Notification
from ..transport import HttpRequest

__all__ = ["PAGERDUTY_SEVERITIES", "PagerDutyReceiver", "pagerduty_event"]

PAGERDUTY_SEVERITIES = ("critical", "error", "warning", "info")
_MAX_SUMMARY = 1024


def _severity(labels: dict[str, str]) -> str:
    sev = labels.get("severity", "warning").lower()
    return sev if sev in PAGERDUTY_SEVERITIES else ("critical" if sev in ("page", "fatal") else "warning")


def _summary(n: Notification) -> str:
    firing = n.firing or n.alerts
    first = dict(firing[0].annotations).get("summary") if firing else None
    name = n.common_labels.get("alertname", "alerts")
    text = first or f"{name} ({', '.join(f'{k}={v}' for k, v in n.group_labels)})"
    if len(firing) > 1:
        text = f"[{len(firing)} alerts] {text}"
    return text[:_MAX_SUMMARY]


def pagerduty_event(n: Notification, *, routing_key: str, source: str) -> dict[str, Any]:
    """The Events API v2 body for `n`: trigger while any alert fires, acknowledge when what
    was paged is silenced or inhibited while still firing, resolve when it all resolved."""
    action = {"firing": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}[n.status]
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": n.group_key,
    }
    if n.status != "firing":
        return event
    common = n.common_labels
    links: list[dict[str, str]] = []
    for a in n.firing:
        url = dict(a.annotations).get("runbook_url")
        if url and all(link["href"] != url for link in links):
            links.append({"href": url, "text": "Runbook"})
    event["payload"] = {
        "summary": _summary(n),
        "source": common.get("model_version") or common.get("gpu") or source,
        "severity": _severity(common),
        "timestamp": min(a.starts_at for a in n.firing).astimezone(dt.UTC).isoformat(),
        "component": common.get("model", source),
        "group": common.get("team", "infersight"),
        "class": common.get("alertname", "infersight_alert"),
        "custom_details": {
            "firing": [
                {"labels": dict(a.labels), "annotations": dict(a.annotations), "value": a.value}
                for a in n.firing
            ],
            "resolved": [dict(a.labels) for a in n.alerts if a.status == "resolved"],
            "group_labels": dict(n.group_labels),
            "notification_id": n.idempotency_key,
        },
    }
    event["client"] = "infersight"
    if n.external_url:
        event["client_url"] = n.external_url
    event["links"] = links
    return event


class PagerDutyReceiver:
    def __init__(self, config: ReceiverConfig) -> None:
        assert config.type == "pagerduty" and config.secret is not None
        self.config = config

    def render(self, notification: Notification, *, sent_at: float) -> HttpRequest:
        body = json.dumps(
            pagerduty_event(notification, routing_key=self.config.secret or "", source=self.config.source),
            sort_keys=True,
        ).encode()
        return HttpRequest(
            url=self.config.url,
            body=body,
            headers=(("Content-Type", "application/json"), ("Idempotency-Key", notification.idempotency_key)),
            timeout_s=self.config.timeout_s,
        )
