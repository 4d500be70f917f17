"""A local webhook receiver that checks Standard Webhooks signatures as a receiver would
(written from the spec, independently of the sender's code): the signed content is
`{webhook-id}.{webhook-timestamp}.{body}`, HMAC-SHA256 with the base64 secret after
`whsec_`, sent as `v1,<base64>` (several, space-separated, may be given); the timestamp
must be within 5 minutes; a message id seen before is acknowledged and not counted twice."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ReceivedWebhook", "WebhookReceiver", "new_secret", "verify_signature"]

_TOLERANCE_S = 300


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def verify_signature(
    secret: str, msg_id: str, timestamp: str, body: bytes, header: str, *, now: float
) -> bool:
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now - ts) > _TOLERANCE_S:
        return False
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for part in header.split():
        version, _, sig = part.partition(",")
        if version != "v1":
            continue
        try:
            if hmac.compare_digest(base64.b64decode(sig, validate=True), expected):
                return True
        except ValueError:
            continue
    return False


@dataclass(frozen=True)
class ReceivedWebhook:
    msg_id: str
    at: float
    payload: Any


class WebhookReceiver:
    """`with WebhookReceiver(secret) as hook:` serves on 127.0.0.1 (a free port) until exit."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: list[ReceivedWebhook] = []
        self.rejected = 0
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/hooks/infersight"

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(min(length, 1 << 20))
                status = receiver._accept(self.headers, body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-webhook", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def _accept(self, headers: Any, body: bytes) -> int:
        msg_id = headers.get("webhook-id") or ""
        ts = headers.get("webhook-timestamp") or ""
        sig = headers.get("webhook-signature") or ""
        if not verify_signature(self.secret, msg_id, ts, body, sig, now=time.time()):
            with self._lock:
                self.rejected += 1
            return 401
        try:
            payload = json.loads(body)
        except ValueError:
            return 400
        with self._lock:
            if msg_id not in self._seen:
                self._seen.add(msg_id)
                self.received.append(ReceivedWebhook(msg_id, time.time(), payload))
        return 204

    def alertnames(self) -> set[str]:
        """Alert names found in the verified payloads received so far."""
        names: set[str] = set()
        with self._lock:
            payloads = [r.payload for r in self.received]
        for p in payloads:
            _collect_alertnames(p, names)
        return names

    def alert_states(self) -> set[tuple[str, str, str]]:
        """(alertname, model_version, status) of every alert in the verified payloads so far."""
        with self._lock:
            payloads = [r.payload for r in self.received]
        out: set[tuple[str, str, str]] = set()
        for p in payloads:
            for alert in p.get("alerts", []) if isinstance(p, dict) else []:
                labels = alert.get("labels") or {}
                out.add(
                    (str(labels.get("alertname")), str(labels.get("model_version")), str(alert.get("status")))
                )
        return out


def _collect_alertnames(obj: Any, out: set[str]) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "alertname" and isinstance(value, str):
                out.add(value)
            else:
                _collect_alertnames(value, out)
    elif isinstance(obj, list):
        for item in obj:
            _collect_alertnames(item, out)
