"""Receivers and delivery to them. Receivers: how one `Notification` becomes one HTTP request (PagerDuty Events API v2,
a Standard Webhooks signed webhook, a Slack-compatible incoming webhook), and the HTTP
seam that sends it: one method, `send(request) -> response`. `HttpxSender` is the real
one; tests pass their own to stay fast, or a real one pointed at a local receiver.
`classify` turns an answer into success, a retry (429, 5xx) or a dead letter.

PagerDuty Events API v2: one event per notification of an alert group.

`dedup_key` is the group key, stable for the group's lifetime, so a repeat trigger
updates the open incident and a resolve closes it. Receivers answer 202; 400 is a bad
event (not retried), 429 and 5xx are retried.

A generic webhook signed per the Standard Webhooks specification.

Headers: `webhook-id` (the notification's idempotency key, the same on every retry),
`webhook-timestamp` (integer seconds of this attempt) and `webhook-signature`:
`v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">`, keyed with the base64-decoded
part of the `whsec_...` secret. The body is Alertmanager's webhook payload (version "4").

Slack-compatible incoming webhooks (Slack, Mattermost, Rocket.Chat): `text` for
clients that show only that, plus Block Kit sections.

Every label and annotation value is escaped before it reaches mrkdwn: `&`, `<` and `>`
become the entities Slack documents (so a value can never open a link or a `<!channel>`
mention), and each formatting marker (`*`, `_`, `~`, a backtick) gets a zero-width space
before it, so that a model name like `a_b_c` or a value with stars cannot turn the rest
of the message bold, italic, struck or into code. The header block is plain text.

Delivering the outbox (`Dispatcher`): claim due rows, render each for its receiver, send, record.

Failures are retried with full-jitter backoff (429, 5xx, timeouts, connection errors;
`Retry-After` honoured); other 4xx, an unknown receiver, an invalid URL, or too many
attempts make a dead letter, which the `dead_letters` signal turns into an alert of its
own. Whatever goes wrong with one entry (a payload that no longer renders, a sender that
raises something unexpected) dead-letters that entry alone: the rest of the batch, and
every later batch, keep flowing. `RetryPolicy`: exponential backoff with full jitter,
honouring `Retry-After` (`classify` judges each answer).
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import hmac
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx
from infersight.monitor.redaction import redact_text
from sqlalchemy import Engine

from ..errors import DeliveryFailed
from .matchers import ReceiverConfig
from .outbox import Notification, OutboxEntry, claim, finish

__all__ = [
    "PAGERDUTY_SEVERITIES",
    "SIGNATURE_TOLERANCE_S",
    "DeliveryResult",
    "Dispatcher",
    "HttpRequest",
    "HttpResponse",
    "HttpSender",
    "HttpxSender",
    "PagerDutyReceiver",
    "Receiver",
    "RetryPolicy",
    "SlackReceiver",
    "WebhookReceiver",
    "build_receiver",
    "build_receivers",
    "classify",
    "pagerduty_event",
    "parse_retry_after",
    "sign",
    "slack_message",
    "url_problem",
    "verify",
]


def url_problem(url: str) -> str | None:
    """Why `url` cannot be sent to (None: it can): not http(s), no host, a port outside
    1..65535, or anything else the HTTP client would refuse at send time."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError as exc:
        return f"url {url!r} is invalid: {exc}"
    if parts.scheme not in ("http", "https"):
        return "url must be http(s)"
    if not parts.hostname:
        return f"url {url!r} has no host"
    if port == 0:
        return f"url {url!r}: port must be in 1..65535"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"url {url!r} is invalid: {exc}"
    return None


@dataclass(frozen=True)
class HttpRequest:
    url: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"
    timeout_s: float = 10.0

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""


@runtime_checkable
class HttpSender(Protocol):
    def send(self, request: HttpRequest) -> HttpResponse:
        """Send and return the response, whatever its status; raise `DeliveryFailed`
        (retryable) on a timeout or a connection error, (not retryable) on a URL that
        cannot be sent to."""
        ...


class HttpxSender:
    def __init__(self, client: httpx.Client | None = None) -> None:
        self._client = client or httpx.Client(follow_redirects=False)

    def send(self, request: HttpRequest) -> HttpResponse:
        problem = url_problem(request.url)  # e.g. port 99999, which httpx would try as 34463
        if problem is not None:
            raise DeliveryFailed(redact_text(problem), retryable=False)
        try:
            r = self._client.request(
                request.method,
                request.url,
                content=request.body,
                headers=list(request.headers),
                timeout=request.timeout_s,
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:  # InvalidURL is no HTTPError
            raise DeliveryFailed(redact_text(f"invalid url {request.url!r}: {exc}"), retryable=False) from exc
        except httpx.TimeoutException as exc:
            raise DeliveryFailed(
                redact_text(f"timeout after {request.timeout_s:g}s: {exc}"), retryable=True
            ) from exc
        except httpx.HTTPError as exc:
            raise DeliveryFailed(
                redact_text(f"connection error: {type(exc).__name__}: {exc}"), retryable=True
            ) from exc
        return HttpResponse(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def close(self) -> None:
        self._client.close()


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - now).total_seconds())


def classify(response: HttpResponse, now: dt.datetime) -> None:
    """Return on 2xx; raise `DeliveryFailed`, retryable for 408, 429 and 5xx, not for other statuses."""
    status = response.status
    if 200 <= status < 300:
        return
    snippet = response.body[:200].decode("utf-8", "replace")
    retryable = status in (408, 429) or status >= 500
    raise DeliveryFailed(
        f"HTTP {status}: {snippet}",
        retryable=retryable,
        status=status,
        retry_after=parse_retry_after(response.headers.get("retry-after"), now) if retryable else None,
    )


@runtime_checkable
class Receiver(Protocol):
    config: ReceiverConfig

    def render(self, notification: Notification, *, sent_at: float) -> HttpRequest:
        """The HTTP request delivering `notification`; `sent_at` (epoch seconds) is this attempt's time."""
        ...


def build_receiver(config: ReceiverConfig) -> Receiver:
    kinds: dict[str, type[PagerDutyReceiver] | type[SlackReceiver] | type[WebhookReceiver]] = {
        "pagerduty": PagerDutyReceiver,
        "webhook": WebhookReceiver,
        "slack": SlackReceiver,
    }
    return kinds[config.type](config)


def build_receivers(configs: Mapping[str, ReceiverConfig]) -> dict[str, Receiver]:
    """Receivers for every enabled config."""
    return {name: build_receiver(c) for name, c in configs.items() if c.enabled}


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
    if not (ts.isascii() and ts.isdigit()):
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


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 1.0
    cap_s: float = 300.0
    max_attempts: int = 15  # then the notification is a dead letter
    max_age_s: float = 86_400.0  # or when it is older than this
    max_retry_after_s: float = 3_600.0  # a receiver's Retry-After is honoured up to this
    lease_s: float = 60.0  # a claimed row is another dispatcher's after this (crash recovery)

    def delay(self, attempts: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds before the next attempt after `attempts` failed ones: uniform in
        [0, min(cap, base * 2**(attempts-1))] (full jitter), but never sooner than Retry-After."""
        ceiling = min(self.cap_s, self.base_s * 2 ** max(0, attempts - 1))
        jittered = rng.uniform(0.0, ceiling)
        if retry_after is not None:
            return max(jittered, min(retry_after, self.max_retry_after_s))
        return jittered


Clock = Callable[[], float]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryResult:
    outbox_id: int
    idempotency_key: str
    receiver: str
    outcome: str  # delivered, retried, dead, lost_lease
    status: int | None
    error: str | None
    next_attempt_in_s: float | None


class Dispatcher:
    def __init__(
        self,
        engine: Engine,
        receivers: Mapping[str, Receiver],
        sender: HttpSender,
        *,
        policy: RetryPolicy | None = None,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        owner: str | None = None,
        on_result: Callable[[DeliveryResult], None] | None = None,
    ) -> None:
        self.engine = engine
        self.receivers = dict(receivers)
        self.sender = sender
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.rng = rng or random.Random()
        self.owner = owner or f"dispatcher-{uuid.uuid4().hex[:12]}"
        self.on_result = on_result

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    def run_once(self, limit: int = 20) -> list[DeliveryResult]:
        """Claim up to `limit` due notifications and attempt each once."""
        entries = claim(self.engine, self.owner, now=self._now(), lease_s=self.policy.lease_s, limit=limit)
        results = []
        for entry in entries:
            result = self._deliver_one(entry)
            if result is None:
                continue
            results.append(result)
            if self.on_result is not None:
                try:
                    self.on_result(result)
                except Exception:  # counting a result never stops the deliveries
                    log.exception("outbox result callback failed")
        return results

    def _deliver_one(self, entry: OutboxEntry) -> DeliveryResult | None:
        """Deliver `entry`; anything unexpected dead-letters it alone. None when not even
        that could be recorded (the store failed): its lease expires and it is tried again."""
        started = time.monotonic()
        try:
            return self._deliver(entry)
        except Exception as exc:
            log.exception("outbox entry %s (receiver %r) failed unexpectedly", entry.id, entry.receiver)
            failure = DeliveryFailed(f"unexpected {type(exc).__name__}: {exc}", retryable=False)
        try:
            return self._failed(entry, failure, time.monotonic() - started)
        except Exception:
            log.exception("could not record the failure of outbox entry %s", entry.id)
            return None

    def run(self, stop: threading.Event, *, poll_s: float = 0.25) -> None:
        """Deliver until `stop` is set; sleeps `poll_s` when nothing is due."""
        while not stop.is_set():
            if not self.run_once():
                stop.wait(poll_s)

    def _deliver(self, entry: OutboxEntry) -> DeliveryResult:
        started = time.monotonic()
        receiver = self.receivers.get(entry.receiver)
        status: int | None = None
        try:
            if receiver is None:
                raise DeliveryFailed(
                    f"receiver {entry.receiver!r} is not configured (or disabled)", retryable=False
                )
            request = receiver.render(entry.notification, sent_at=self.clock())
            response = self.sender.send(request)
            status = response.status
            classify(response, self._now())
        except DeliveryFailed as exc:
            return self._failed(entry, exc, time.monotonic() - started)
        ok = finish(
            self.engine,
            entry,
            "delivered",
            now=self._now(),
            duration_s=time.monotonic() - started,
            status=status,
        )
        return DeliveryResult(
            entry.id,
            entry.idempotency_key,
            entry.receiver,
            "delivered" if ok else "lost_lease",
            status,
            None,
            None,
        )

    def _failed(self, entry: OutboxEntry, exc: DeliveryFailed, duration_s: float) -> DeliveryResult:
        now = self._now()
        attempts = entry.attempts + 1
        age = (now - entry.created_at).total_seconds()
        dead = not exc.retryable or attempts >= self.policy.max_attempts or age >= self.policy.max_age_s
        delay = None if dead else self.policy.delay(attempts, self.rng, exc.retry_after)
        ok = finish(
            self.engine,
            entry,
            "dead" if dead else "retried",
            now=now,
            duration_s=duration_s,
            status=exc.status,
            error=exc.reason[:1000],
            next_attempt_at=None if delay is None else now + dt.timedelta(seconds=delay),
        )
        outcome = ("dead" if dead else "retried") if ok else "lost_lease"
        return DeliveryResult(
            entry.id, entry.idempotency_key, entry.receiver, outcome, exc.status, exc.reason, delay
        )
