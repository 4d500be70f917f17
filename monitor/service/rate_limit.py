"""Per-client request rates: a flooding client pays for its flood, the others do not.

`ClientRateLimit` is a pure ASGI middleware, the outermost of the app: each request is
charged to its client, the pair (client address, whether it carries the bearer token), in a
token bucket (`rate` requests per second, up to `burst` at once). A request over its
client's rate is answered `429` with `Retry-After` (the seconds until its bucket holds a
request again) before anything else runs: no routing, no body read, no JSON parse, no
tokenizing, no record; only a counter (`infersight_http_refused_total{reason}`) moves. So a
client that asks again 10 ms after each refusal costs the service a dictionary look-up per
refusal, and the other clients' requests are served as if it were not there. A client that
asks again before the `Retry-After` it was told gets its next 429 only at that time (at most
`MAX_HOLD_S` later; held
on a timer: no CPU; at most `max_held` at once, then answered at once; and one address holds
at most `limits.max_connections_per_client` connections): a flood that ignores `Retry-After`
is slowed to the pace it was asked to keep, while a client that honours it never waits.
The app's own refusals with `Retry-After` (the length breaker's 503, a full queue's 429) are
held the same way for a client that comes back before their time: a flood of long prompts
that ignores the breaker's `Retry-After` is slowed to one request per thread per
`Retry-After`, not refused 200 times a second (each refusal still costs a parse, a tokenizing
and a record), while the same client's requests that are answered are never delayed.

The token is the operator's: requests that carry it are charged to a bucket of their own
(`token_rate`, `token_burst`), apart from the token-less requests from the same address
(an application on localhost that sends the token is not slowed down by a token-less flood
from localhost). `token_rate = 0` (the default) exempts them. `rate = 0` turns the limit
off for token-less requests.

The table of buckets is bounded (`max_clients`, least recently used first out): 10,000
distinct addresses cost 10,000 small entries at most. A client dropped from the table comes
back with a full bucket, which is what an idle client would have had anyway; a client that
is flooding is the most recently used, so it is the last to be dropped.

The address is the connection's peer: `infersight serve` does not trust `X-Forwarded-For`
(`server_options`), which a client on loopback could set to a new address on every request.
Behind a reverse proxy every request has the proxy's address: limit rates at the proxy, or
raise `client_rate`, or run the app under uvicorn with `--forwarded-allow-ips` naming the
proxy."""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["REFUSED_REASONS", "ClientRateLimit", "RateLimited", "TokenBuckets"]

REFUSED_REASONS = ("client_rate", "token_client_rate")  # the `reason` label's values
MAX_HOLD_S = 5.0  # the longest a refusal is held


@dataclass(frozen=True)
class RateLimited:
    """A request refused over its client's rate: retry after `retry_after_s` seconds (the
    `Retry-After` header says it in whole seconds, rounded up). `hold_s`: the client asked
    again before the `Retry-After` it was last given, so its answer waits that long."""

    retry_after_s: float
    hold_s: float = 0.0


class TokenBuckets:
    """Token buckets keyed by client, at most `max_clients` of them (least recently used out).
    `take(key, now)` charges one request: None when it may pass, else `RateLimited`."""

    def __init__(self, rate: float, burst: float, *, max_clients: int) -> None:
        if not (rate > 0 and burst >= 1 and max_clients >= 1):
            raise ValueError("rate must be > 0, burst >= 1 and max_clients >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[Any, list[float]] = OrderedDict()  # key -> [tokens, at, told until]

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Any, now: float) -> RateLimited | None:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_clients:
                self._buckets.popitem(last=False)
            self._buckets[key] = [self.burst - 1.0, now, now]
            return None
        self._buckets.move_to_end(key)
        tokens = min(self.burst, bucket[0] + max(0.0, now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return None
        bucket[0] = tokens
        retry = (1.0 - tokens) / self.rate
        if now < bucket[2]:  # back before the Retry-After it was told: held until then
            return RateLimited(retry, min(MAX_HOLD_S, bucket[2] - now))
        bucket[2] = now + max(1, math.ceil(retry))  # what its Retry-After says
        return RateLimited(retry)


class ClientRateLimit:
    """ASGI middleware: `rate`/`burst` per token-less client address, `token_rate`/
    `token_burst` per address for requests with the bearer token (`token()` gives it;
    `token_rate = 0`: exempt). `on_refused(reason)` is called once per refusal (a counter)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        rate: float,
        burst: float,
        token: Callable[[], str],
        token_rate: float = 0.0,
        token_burst: float = 0.0,
        max_clients: int = 10_000,
        max_held: int = 1024,
        on_refused: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.app = app
        self.anonymous = TokenBuckets(rate, burst, max_clients=max_clients) if rate > 0 else None
        self.holders = (
            TokenBuckets(token_rate, max(1.0, token_burst), max_clients=max_clients)
            if token_rate > 0
            else None
        )
        self._token = token
        self._on_refused = on_refused
        self._clock = clock
        self._sleep = sleep
        self.max_held = max_held
        self.held = 0  # refusals waiting to be answered now
        # client -> (when the app last refused it, when that refusal's Retry-After ends)
        self._told: OrderedDict[Any, tuple[float, float]] = OrderedDict()
        self._max_told = max_clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.anonymous is None and self.holders is None):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        addr = client[0] if client else ""
        if _has_token(scope, self._token()):
            buckets, reason = self.holders, "token_client_rate"
        else:
            buckets, reason = self.anonymous, "client_rate"
        arrived = self._clock()
        refused = buckets.take(addr, arrived) if buckets is not None else None
        if refused is None:
            if buckets is None:  # exempt (the token's requests by default): never held
                await self.app(scope, receive, send)
            else:
                await self.app(scope, receive, self._holding(send, (addr, reason), arrived))
            return
        self._on_refused(reason)
        if refused.hold_s > 0 and self.held < self.max_held:
            self.held += 1
            try:
                await self._sleep(refused.hold_s)
            finally:
                self.held -= 1
        await _send_429(send, refused.retry_after_s)

    def _holding(self, send: Send, key: Any, arrived: float) -> Send:
        """`send`, with the app's own refusals (a 429 or 503 with `Retry-After`: a shed, a
        full queue) held like the limit's: a client that asks again before the Retry-After
        of its last refusal gets this refusal at that time. Only a request that arrived
        after that refusal was sent is held (requests already in flight did not ignore it),
        and only a refusal: an answered request is never delayed."""

        async def held_send(message: Any) -> None:
            if message["type"] == "http.response.start" and message.get("status") in (429, 503):
                retry = _retry_after(message.get("headers") or ())
                if retry is not None:
                    await self._hold_refusal(key, arrived, retry)
            await send(message)

        return held_send

    async def _hold_refusal(self, key: Any, arrived: float, retry_after_s: float) -> None:
        told = self._told.get(key)
        now = self._clock()
        if told is not None and told[0] <= arrived < told[1] and now < told[1] and self.held < self.max_held:
            self.held += 1
            try:
                await self._sleep(min(MAX_HOLD_S, told[1] - now))
            finally:
                self.held -= 1
            now = max(now, self._clock())
        if key not in self._told and len(self._told) >= self._max_told:
            self._told.popitem(last=False)
        self._told[key] = (now, now + retry_after_s)
        self._told.move_to_end(key)


def _retry_after(headers: Any) -> float | None:
    for name, value in headers:
        if name.lower() == b"retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


def _has_token(scope: Scope, expected: str) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, given = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(
                given.strip(), expected.encode("utf-8")
            )
    return False


_BODY = (
    b'{"error":{"type":"rate_limited","code":"rate_limited","field":null,"param":null,'
    b'"message":"too many requests from this client; retry after the Retry-After seconds"}}'
)


async def _send_429(send: Send, retry_after_s: float) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_BODY)).encode()),
        (b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": _BODY})
