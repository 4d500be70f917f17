"""The bounded queue of sampled records and the thread that delivers them in batches.

`put()` is the only part on a caller's path: a lock, a length check and an append.
A full queue drops the record and counts it; it never blocks. Records are turned
into `InferenceRecord`s (ids, redaction, truncation) on the delivery thread, which
wakes every `flush_interval_s` or as soon as a batch is waiting. A stalled sink
stalls only that thread.

HttpSink delivers batches to the sidecar's `POST /api/v1/events` (bearer token).

Wire format (docs/architecture.md): `{"events": [record, ...]}`, answered
`200 {"accepted": n, "rejected": [{"index", "field", "reason"}]}`. Connection errors,
429 and 5xx are retried with exponential backoff and jitter (honouring a
`Retry-After` in seconds, capped); any other 4xx is not retried. Runs only on the
delivery thread. The httpx client is created lazily and re-created in a forked child.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson
from infersight.monitor.records import InferenceRecord
from infersight.monitor.redaction import redact_url

from ._config import SDKConfig, SDKConfigError, SDKCounters, SinkRejected, SinkUnavailable

__all__ = ["HttpSink", "Outbox"]


class Outbox:
    def __init__(
        self,
        get_config: Callable[[], SDKConfig],
        counters: SDKCounters,
        to_records: Callable[[list[Any]], list[InferenceRecord]],
    ) -> None:
        self._config = get_config
        self._counters = counters
        self._to_records = to_records
        self._queue_full = counters.tally("dropped", "queue_full").incr
        self._reset()

    def _reset(self) -> None:
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Condition(threading.Lock())
        self._busy = 0  # batches taken off the queue and not yet delivered
        self._thread: threading.Thread | None = None
        self._stopping = False

    def __len__(self) -> int:
        return len(self._queue)

    # -- the caller's side ------------------------------------------------------------
    def put(self, item: Any) -> None:
        config = self._config()
        queue = self._queue
        with self._lock:
            depth = len(queue)
            if depth < config.queue_size:
                queue.append(item)
        if depth >= config.queue_size:
            self._queue_full()
            return
        if self._thread is None:
            self._start()
        if depth + 1 == config.batch_size:
            self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="infersight-sdk-outbox", daemon=True)
        self._thread.start()

    # -- the delivery thread ------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._config().flush_interval_s)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        while True:
            config = self._config()
            with self._lock:
                n = min(len(self._queue), config.batch_size)
                items = [self._queue.popleft() for _ in range(n)]
                if n:
                    self._busy += 1
            if not items:
                break
            try:
                self._deliver(items, config)
            finally:
                with self._lock:
                    self._busy -= 1
        with self._idle:
            self._idle.notify_all()

    def _deliver(self, items: list[Any], config: SDKConfig) -> None:
        try:
            records = self._to_records(items)
        except Exception:
            records = self._to_records_one_by_one(items)
        if not records or config.sink is None:
            return
        try:
            refused = config.sink(records)
        except Exception:  # SinkError, or anything a user's callable raises
            self._counters.count("dropped", "sink_error", len(records))
            return
        refused = refused if isinstance(refused, int) and 0 < refused <= len(records) else 0
        self._counters.count("dropped", "server_rejected", refused)
        self._counters.sent.add(len(records) - refused)

    def _to_records_one_by_one(self, items: list[Any]) -> list[InferenceRecord]:
        """The slow path after a batch failed: keep every item that converts, count the rest."""
        records = []
        for item in items:
            try:
                records.extend(self._to_records([item]))
            except Exception:
                self._counters.count("internal", "make_record")
        return records

    # -- flushing -------------------------------------------------------------------------
    def flush(self, timeout: float) -> bool:
        """Deliver what is queued now; True when the queue emptied within `timeout`."""
        deadline = time.monotonic() + timeout
        if self._thread is None or not self._thread.is_alive():
            self._thread = None
            if not self._queue:
                return True
            self._start()
        self._wake.set()
        with self._idle:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def stop(self, timeout: float) -> bool:
        flushed = self.flush(timeout)
        self._stopping = True
        self._wake.set()
        return flushed

    def after_fork_in_child(self) -> None:
        """The parent delivers what it had queued; the child starts empty, thread-less."""
        self._reset()


_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class HttpSink:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`url`: the full endpoint, e.g. `http://127.0.0.1:8000/api/v1/events`.
        `transport`: an httpx transport (the seam for tests); `sleep`: the backoff's clock."""
        if not url.startswith(("http://", "https://")):
            raise SDKConfigError(f"HttpSink url must start with http:// or https://, got {url!r}")
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise SDKConfigError("HttpSink needs retries >= 0, backoff_s >= 0 and timeout_s > 0")
        self.url = url
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout_s
        self._retries = retries
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._transport = transport
        self._sleep = sleep
        self._client: httpx.Client | None = None
        self._pid = -1

    def _http(self) -> httpx.Client:
        if self._client is None or self._pid != os.getpid():
            self._client = httpx.Client(timeout=self._timeout, transport=self._transport)
            self._pid = os.getpid()
        return self._client

    def __call__(self, records: Sequence[InferenceRecord]) -> int:
        """Send one batch; returns how many records the receiver refused."""
        # orjson serialises the frozen dataclasses natively (field order = the wire format)
        return self._post(self.url, orjson.dumps({"events": list(records)}), len(records))

    @property
    def feedback_url(self) -> str:
        """The sidecar's `POST /api/v1/feedback` beside the events endpoint."""
        base = self.url.removesuffix("/events") if self.url.endswith("/events") else self.url.rsplit("/", 1)[0]
        return f"{base}/feedback"

    def send_feedback(self, items: Sequence[dict[str, Any]]) -> int:
        """Send users' feedback items (all or nothing: a refused batch raises SinkRejected)."""
        self._post(self.feedback_url, orjson.dumps({"feedback": list(items), "source": "sdk"}), len(items))
        return 0

    def _post(self, url: str, body: bytes, sent: int) -> int:
        problem = "no attempt made"
        for attempt in range(self._retries + 1):
            if attempt:
                self._sleep(self._delay(attempt, problem))
            try:
                response = self._http().post(url, content=body, headers=self._headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 200:
                return _refused(response, sent)
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code not in _RETRY_STATUS:
                raise SinkRejected(f"{redact_url(url)} refused the batch: {problem}")
            retry_after = response.headers.get("Retry-After", "")
            if retry_after.isascii() and retry_after.isdigit():
                problem = f"retry-after:{retry_after}"
        raise SinkUnavailable(f"{redact_url(url)}: {self._retries + 1} attempts failed; last: {problem}")

    def _delay(self, attempt: int, problem: str) -> float:
        if problem.startswith("retry-after:"):
            return min(float(problem.split(":", 1)[1]), self._max_backoff)
        base = min(self._max_backoff, self._backoff * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _refused(response: httpx.Response, sent: int) -> int:
    try:
        answer: Any = response.json()
    except ValueError:
        return 0
    rejected = answer.get("rejected") if isinstance(answer, dict) else None
    return min(sent, len(rejected)) if isinstance(rejected, list) else 0
