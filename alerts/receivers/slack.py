"""Slack-compatible incoming webhooks (Slack, Mattermost, Rocket.Chat): `text` for
clients that show only that, plus Block Kit sections.

Every label and annotation value is escaped before it reaches mrkdwn: `&`, `<` and `>`
become the entities Slack documents (so a value can never open a link or a `<!channel>`
mention), and each formatting marker (`*`, `_`, `~`, a backtick) gets a zero-width space
before it, so that a model name like `a_b_c` or a value with stars cannot turn the rest
of the message bold, italic, struck or into code. The header block is plain text.
"""

from __future__ import annotations

import json
from typing import Any

from ..matchers import ReceiverConfig
from ..notification import Notification
from ..transport import HttpRequest

__all__ = ["SlackReceiver", "slack_message"]

_MAX_ALERTS = 10
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_MARKERS = frozenset("*_~`")
_ZWSP = "\u200b"


def mrkdwn_escape(value: str) -> str:
    """`value` shown literally inside Slack mrkdwn."""
    out = []
    for ch in value:
        if ch in _ENTITIES:
            out.append(_ENTITIES[ch])
        elif ch in _MARKERS:
            out.append(_ZWSP + ch)
        else:
            out.append(ch)
    return "".join(out)


def _url(value: str) -> str:
    """A link target inside `<url|label>`: entities, and no `|` or `>` that would end it."""
    return value.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")


def slack_message(n: Notification) -> dict[str, Any]:
    name = n.common_labels.get("alertname", "alerts")
    icon = ":red_circle:" if n.status == "firing" else ":large_green_circle:"
    tag = f"{icon} [{n.status.upper()}{f':{len(n.firing)}' if n.status == 'firing' else ''}]"
    head = f"{tag} {name}"
    lines = []
    for a in n.alerts[:_MAX_ALERTS]:
        ann = dict(a.annotations)
        text = ann.get("summary") or ", ".join(f"{k}={v}" for k, v in a.labels)
        runbook = f" <{_url(ann['runbook_url'])}|runbook>" if ann.get("runbook_url") else ""
        lines.append(f"• *{a.status}* {mrkdwn_escape(text)}{runbook}")
    if len(n.alerts) > _MAX_ALERTS:
        lines.append(f"… and {len(n.alerts) - _MAX_ALERTS} more")
    body = "\n".join(lines)
    return {
        "text": f"{tag} {mrkdwn_escape(name)}\n{body}",
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
