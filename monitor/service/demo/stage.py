"""What the demo sets around the service: its alert rules, the traffic it sends and the webhook
receiver that checks what arrives.

The demo's alert rules: the shipped quality rules with short timings, a latency SLO, and
one route to the local signed-webhook receiver.

Customer-service traffic for the demo: real utterances through the OpenAI endpoint.

A local webhook receiver that checks Standard Webhooks signatures as a receiver would
(written from the spec, independently of the sender's code): the signed content is
`{webhook-id}.{webhook-timestamp}.{body}`, HMAC-SHA256 with the base64 secret after
`whsec_`, sent as `v1,<base64>` (several, space-separated, may be given); the timestamp
must be within 5 minutes; a message id seen before is acknowledged and not counted twice."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = [
    "ReceivedWebhook",
    "TrafficResult",
    "WebhookReceiver",
    "demo_rules",
    "keep_sending",
    "new_secret",
    "send_chats",
    "verify_signature",
]

_RULES = """\
# infersight demo rules: short intervals so the incident plays out in minutes.
groups:
  - name: quality
    interval: 1s
    rules:
      - alert: PromptDrift
        signal: {kind: drift_p_value, field: prompt}
        op: "<"
        threshold: 0.01
        by: [model, model_version]
        keep_firing_for: 2s
        labels: {severity: warning, team: ml-quality}
        annotations:
          summary: "prompts to {{ $labels.model_version }} drifted from the reference (p = {{ $value | printf \\"%.2g\\" }})"
        actions:
          - {type: snapshot, requests: 50, cooldown: 1h}
slos:
  # generous on purpose (the demo's story is drift and a bad release, not latency): it shows
  # the error budget and burn rate on the page and in Grafana without paging
  - {name: answers-within-30s, objective: 0.99, threshold_ms: 30000, window: 30d}
receivers:
  - name: demo-hook
    webhook: {url: "HOOK_URL", secret: "HOOK_SECRET"}
route:
  receiver: demo-hook
  group_by: [alertname, model_version]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
"""


def demo_rules(hook_url: str, secret: str) -> str:
    return _RULES.replace("HOOK_URL", hook_url).replace("HOOK_SECRET", secret)


SYSTEM = "you are the assistant of an online bank. answer the customer's question."


@dataclass(frozen=True)
class TrafficResult:
    sent: int
    ok: int
    errors: tuple[str, ...]
    versions: frozenset[str]


def send_chats(
    base_url: str,
    utterances: Sequence[str],
    *,
    workers: int = 8,
    max_tokens: int = 16,
    stream_every: int = 4,
    users: Sequence[str] | None = None,
) -> TrafficResult:
    """One chat completion per utterance, `workers` at a time; every `stream_every`-th streamed;
    `users[i]` is the OpenAI `user` of the i-th (what keeps a user on one version in a canary)."""

    def one(i: int, text: str, client: httpx.Client) -> tuple[bool, str]:
        body: dict[str, Any] = {"model": None, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                "max_tokens": max_tokens, "temperature": 0.0}  # fmt: skip
        body.pop("model")
        if users is not None:
            body["user"] = users[i]
        try:
            if stream_every and i % stream_every == 0:
                with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    lines = [line for line in r.iter_lines() if line]
                    if r.status_code != 200 or not lines or lines[-1] != "data: [DONE]":
                        return False, f"stream {r.status_code}"
                    return True, ""
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                return False, f"{r.status_code} {r.text[:120]}"
            return True, str(r.json().get("model"))
        except httpx.HTTPError as exc:
            return False, type(exc).__name__

    versions: set[str] = set()
    errors: list[str] = []
    ok = 0
    with httpx.Client(base_url=base_url, timeout=60.0) as client, ThreadPoolExecutor(workers) as pool:
        for success, info in pool.map(lambda p: one(p[0], p[1], client), enumerate(utterances)):
            if success:
                ok += 1
                if info:
                    versions.add(info)
            else:
                errors.append(info)
    return TrafficResult(len(utterances), ok, tuple(errors[:5]), frozenset(versions))


def keep_sending(
    base_url: str,
    utterances: Sequence[str],
    *,
    rounds: int,
    user_prefix: str | None = None,
    max_tokens: int = 16,
) -> tuple[threading.Event, list[int], threading.Thread]:
    """Users keep asking, 20 at a time, while an analysis decides; set the event to stop.
    With `user_prefix` each request names its own user (what a canary assigns by)."""
    stop = threading.Event()
    sent: list[int] = []

    def run() -> None:
        i = 0
        while not stop.is_set() and i < rounds:
            chunk = utterances[(i * 20) % len(utterances) :][:20] or utterances[:20]
            users = [f"{user_prefix}-{i}-{j}" for j in range(len(chunk))] if user_prefix else None
            sent.append(send_chats(base_url, chunk, users=users, max_tokens=max_tokens).sent)
            i += 1

    worker = threading.Thread(target=run, name="demo-traffic", daemon=True)
    worker.start()
    return stop, sent, worker


def sample(texts: Sequence[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return rng.sample(list(texts), min(n, len(texts)))


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
