"""HttpSink: deliver batches to the sidecar's `POST /api/v1/events` (bearer token).

Wire format (docs/architecture.md): `{"events": [record, ...]}`, answered
`200 {"accepted": n, "rejected": [{"index", "field", "reason"}]}`. Connection errors,
429 and 5xx are retried with exponential backoff and jitter (honouring a
`Retry-After` in seconds, capped); any other 4xx is not retried. Runs only on the
delivery thread. The httpx client is created lazily and re-created in a forked child.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson
from infersight.monitor.records import InferenceRecord

from .errors import SDKConfigError, SinkRejected, SinkUnavailable

__all__ = ["HttpSink"]

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
        body = orjson.dumps({"events": list(records)})
        problem = "no attempt made"
        for attempt in range(self._retries + 1):
            if attempt:
                self._sleep(self._delay(attempt, problem))
            try:
                response = self._http().post(self.url, content=body, headers=self._headers)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 200:
                return _refused(response, len(records))
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code not in _RETRY_STATUS:
                raise SinkRejected(f"{self.url} refused the batch: {problem}")
            retry_after = response.headers.get("Retry-After", "")
            if retry_after.isdigit():
                problem = f"retry-after:{retry_after}"
        raise SinkUnavailable(f"{self.url}: {self._retries + 1} attempts failed; last: {problem}")

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
