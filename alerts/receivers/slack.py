"""Slack-compatible incoming webhooks (Slack, Mattermost, Rocket.Chat): `text` for
clients that show only that, plus Block Kit sections."""

from __future__ import annotations

import json
from typing import Any

from ..config import ReceiverConfig
from ..notification import Notification
from ..transport import HttpRequest

__all__ = ["SlackReceiver", "slack_message"]

_MAX_ALERTS = 10


def slack_message(n: Notification) -> dict[str, Any]:
    name = n.common_labels.get("alertname", "alerts")
    icon = ":red_circle:" if n.status == "firing" else ":large_green_circle:"
    head = f"{icon} [{n.status.upper()}{f':{len(n.firing)}' if n.status == 'firing' else ''}] {name}"
    lines = []
    for a in n.alerts[:_MAX_ALERTS]:
        ann = dict(a.annotations)
        text = ann.get("summary") or ", ".join(f"{k}={v}" for k, v in a.labels)
        runbook = f" <{ann['runbook_url']}|runbook>" if ann.get("runbook_url") else ""
        lines.append(f"• *{a.status}* {text}{runbook}")
    if len(n.alerts) > _MAX_ALERTS:
        lines.append(f"… and {len(n.alerts) - _MAX_ALERTS} more")
    body = "\n".join(lines)
    return {
        "text": f"{head}\n{body}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000] or "(no alerts)"}},
        ],
    }


class SlackReceiver:
    def __init__(self, config: ReceiverConfig) -> None:
        assert config.type == "slack"
        self.config = config

    def render(self, notification: Notification, *, sent_at: float) -> HttpRequest:
        body = json.dumps(slack_message(notification)).encode()
        headers = (("Content-Type", "application/json"), ("Idempotency-Key", notification.idempotency_key))
        return HttpRequest(self.config.url, body, headers, timeout_s=self.config.timeout_s)
