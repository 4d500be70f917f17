"""Receivers: how one `Notification` becomes one HTTP request (PagerDuty Events API v2,
a Standard Webhooks signed webhook, a Slack-compatible incoming webhook)."""

from __future__ import annotations

from ._base import Receiver, build_receiver, build_receivers
from .pagerduty import PagerDutyReceiver, pagerduty_event
from .slack import SlackReceiver, slack_message
from .webhook import WebhookReceiver, sign, verify

__all__ = [
    "PagerDutyReceiver",
    "Receiver",
    "SlackReceiver",
    "WebhookReceiver",
    "build_receiver",
    "build_receivers",
    "pagerduty_event",
    "sign",
    "slack_message",
    "verify",
]
