"""Delivering the outbox: claim due rows, render each for its receiver, send, record.

Failures are retried with full-jitter backoff (429, 5xx, timeouts, connection errors;
`Retry-After` honoured); other 4xx, an unknown receiver, an invalid URL, or too many
attempts make a dead letter, which the `dead_letters` signal turns into an alert of its
own. Whatever goes wrong with one entry (a payload that no longer renders, a sender that
raises something unexpected) dead-letters that entry alone: the rest of the batch, and
every later batch, keep flowing. `RetryPolicy`: exponential backoff with full jitter,
honouring `Retry-After` (receivers.py classifies each answer).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from ..errors import DeliveryFailed
from .outbox import OutboxEntry, claim, finish
from .receivers import HttpSender, Receiver, classify

__all__ = ["DeliveryResult", "Dispatcher", "RetryPolicy"]



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
