"""Helpers shared by the alerts tests (no tests here): a database per backend, a manual
clock, and a real local HTTP receiver that validates payloads as PagerDuty or a Standard
Webhooks consumer would, dedups by idempotency key and counts."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from infersight.alerts.notify.receivers import PAGERDUTY_SEVERITIES, verify
from infersight.monitor.store import connect
from infersight.monitor.store.tables import metadata
from sqlalchemy import Engine

WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ROUTING_KEY = "R0123456789abcdef0123456789abcde"  # 32 characters, like a real integration key
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s

    @property
    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)


def make_engine(url: str) -> Engine:
    engine = connect(url)
    metadata.create_all(engine)
    return engine


@contextmanager
def database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A fresh schema on SQLite (a file) or on the real PostgreSQL (`postgres_url` fixture).
    Test modules wrap this in their own fixture (`yield from`-style via `with`)."""
    url = (
        f"sqlite:///{tmp_path}/alerts.sqlite" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    )
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def pagerduty_errors(event: Any) -> list[str]:
    """What PagerDuty's Events API v2 would refuse in `event` (empty: valid)."""
    errs = []
    if not isinstance(event, dict):
        return ["body is not an object"]
    allowed = {
        "routing_key",
        "event_action",
        "dedup_key",
        "payload",
        "client",
        "client_url",
        "links",
        "images",
    }
    errs += [f"unknown field {k}" for k in event if k not in allowed]
    if not isinstance(event.get("routing_key"), str) or len(event["routing_key"]) != 32:
        errs.append("routing_key must be a 32-character string")
    action = event.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        errs.append("event_action invalid")
    key = event.get("dedup_key")
    if action != "trigger" and not key:
        errs.append("dedup_key required for acknowledge/resolve")
    if key is not None and (not isinstance(key, str) or len(key) > 255):
        errs.append("dedup_key must be a string of at most 255 characters")
    if action == "trigger":
        p = event.get("payload")
        if not isinstance(p, dict):
            return [*errs, "payload required for trigger"]
        allowed_p = {
            "summary",
            "source",
            "severity",
            "timestamp",
            "component",
            "group",
            "class",
            "custom_details",
        }
        errs += [f"unknown payload field {k}" for k in p if k not in allowed_p]
        if not isinstance(p.get("summary"), str) or not 0 < len(p["summary"]) <= 1024:
            errs.append("payload.summary must be 1..1024 characters")
        if not isinstance(p.get("source"), str) or not p["source"]:
            errs.append("payload.source required")
        if p.get("severity") not in PAGERDUTY_SEVERITIES:
            errs.append("payload.severity invalid")
        if "timestamp" in p:
            try:
                dt.datetime.fromisoformat(p["timestamp"])
            except (TypeError, ValueError):
                errs.append("payload.timestamp is not ISO 8601")
        for k in ("component", "group", "class"):
            if k in p and not isinstance(p[k], str):
                errs.append(f"payload.{k} must be a string")
        if "custom_details" in p and not isinstance(p["custom_details"], dict):
            errs.append("payload.custom_details must be an object")
        for link in event.get("links", []):
            if not isinstance(link, dict) or not isinstance(link.get("href"), str):
                errs.append("links[] need href")
    return errs


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    key: str | None
    status: int

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class LocalReceiver:
    """A real HTTP server on 127.0.0.1. `script(n) -> (status, headers)` decides the
    answer to the n-th request (0-based); by default 202. With `kind="pagerduty"` it
    refuses invalid events with 400, with `kind="webhook"` it verifies signatures."""

    kind: str = "webhook"
    secret: str | None = WHSEC
    script: Callable[[int], tuple[int, dict[str, str]]] | None = None
    delay_s: Callable[[int], float] | None = None
    hold_s: Callable[[int], float] | None = None  # after recording an accepted request, before answering
    holding: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] | None = None
    requests: list[Received] = field(default_factory=list)
    accepted: Counter[str] = field(default_factory=Counter)  # key -> times accepted as new
    duplicates: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def _answer(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes, str | None]:
        with self.lock:
            n = len(self.requests)
        if self.delay_s is not None:
            threading.Event().wait(self.delay_s(n))
        status, extra = self.script(n) if self.script is not None else (202, {})
        key = headers.get("idempotency-key")
        if status >= 300:
            return status, extra, b'{"status":"error"}', key
        if self.kind == "pagerduty":
            errs = pagerduty_errors(json.loads(body))
            if errs:
                return 400, {}, json.dumps({"status": "invalid event", "errors": errs}).encode(), key
            answer = {
                "status": "success",
                "message": "Event processed",
                "dedup_key": json.loads(body).get("dedup_key"),
            }
            return 202, {}, json.dumps(answer).encode(), key
        if self.kind == "webhook" and self.secret is not None:
            import time

            try:
                key = verify(self.secret, headers, body, now=(self.clock or time.time)())
            except ValueError as exc:
                return 401, {}, str(exc).encode(), key
        return 200, {}, b"ok", key

    def __enter__(self) -> LocalReceiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, reply, key = outer._answer(headers, body)
                with outer.lock:
                    outer.requests.append(Received(self.path, headers, body, key, status))
                    n = len(outer.requests) - 1
                    if 200 <= status < 300 and key is not None:
                        if key in outer.accepted:
                            outer.duplicates[key] += 1
                        else:
                            outer.accepted[key] += 1
                hold = outer.hold_s(n) if outer.hold_s is not None else 0.0
                if hold > 0:
                    outer.holding.set()
                    threading.Event().wait(hold)
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
