"""A generic webhook signed per the Standard Webhooks specification.

Headers: `webhook-id` (the notification's idempotency key, the same on every retry),
`webhook-timestamp` (integer seconds of this attempt) and `webhook-signature`:
`v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">`, keyed with the base64-decoded
part of the `whsec_...` secret. The body is Alertmanager's webhook payload (version "4").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping

from ..matchers import ReceiverConfig
from ..notification import Notification
from ..transport import HttpRequest

__all__ = ["SIGNATURE_TOLERANCE_S", "WebhookReceiver", "sign", "verify"]

SIGNATURE_TOLERANCE_S = 300


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one message."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, now: float) -> str:
    """What a receiver does: check the signature and the timestamp's freshness and return
    the message id; raise ValueError saying what is wrong."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, ts, sigs = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not msg_id or not ts or not sigs:
        raise ValueError("missing webhook-id, webhook-timestamp or webhook-signature")
    if not ts.isdigit():
        raise ValueError("webhook-timestamp is not integer seconds")
    if abs(now - int(ts)) > SIGNATURE_TOLERANCE_S:
        raise ValueError("webhook-timestamp outside the tolerance")
    expected = sign(secret, msg_id, int(ts), body)
    if not any(hmac.compare_digest(expected, s) for s in sigs.split(" ")):
        raise ValueError("no valid v1 signature")
    return msg_id


class WebhookReceiver:
    def __init__(self, config: ReceiverConfig) -> None:
        assert config.type == "webhook"
        self.config = config

    def render(self, notification: Notification, *, sent_at: float) -> HttpRequest:
        body = json.dumps(notification.to_json(), sort_keys=True).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Idempotency-Key", notification.idempotency_key),
            ("webhook-id", notification.idempotency_key),
        ]
        if self.config.secret is not None:
            ts = int(sent_at)
            headers += [
                ("webhook-timestamp", str(ts)),
                ("webhook-signature", sign(self.config.secret, notification.idempotency_key, ts, body)),
            ]
        return HttpRequest(self.config.url, body, tuple(headers), timeout_s=self.config.timeout_s)
