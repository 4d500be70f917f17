"""Per-client request rates (issue 22, section 1: a flooding client pays, not the others).

A client over its rate is answered 429 + Retry-After before anything reads its body or
routes it (no record, a counter only), while another client is served; the table of
clients stays bounded; requests with the token have their own limit (exempt by default).
Time is a controlled clock in the middleware's tests, and a rate near zero in the app's,
so nothing here depends on how fast this machine is."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _service_support import TOKEN, auth, config, wait_for
from fastapi.testclient import TestClient
from infersight.monitor.service import create_app
from infersight.monitor.service.config import ConfigInvalid, LimitsConfig, config_from_mapping
from infersight.monitor.service.overload import server_options
from infersight.monitor.service.rate_limit import ClientRateLimit, RateLimited, TokenBuckets
from sqlalchemy import func, select


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.holds: list[float] = []  # the refusals held, and for how long

    async def sleep(self, seconds: float) -> None:
        self.holds.append(seconds)

    def __call__(self) -> float:
        return self.now


class Inner:
    """The app behind the limit: counts the requests it got."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _call(app: Any, addr: str, token: str | None = None) -> tuple[int, dict[bytes, bytes]]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers,
             "client": (addr, 40000)}  # fmt: skip
    sent: list[dict[str, Any]] = []
    reads: list[int] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return {"type": "http.request", "body": b'{"prompt": "hi"}', "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    if start["status"] == 429:
        assert not reads, "a refused request's body was read"
    return start["status"], dict(start["headers"])


def _limit(inner: Inner, clock: Clock, refused: list[str], **kw: Any) -> ClientRateLimit:
    kw = {"rate": 2.0, "burst": 4.0, "sleep": clock.sleep, **kw}
    return ClientRateLimit(inner, token=lambda: TOKEN, on_refused=refused.append, clock=clock, **kw)


def test_token_buckets_allow_a_burst_then_the_rate_and_say_when_to_retry() -> None:
    buckets = TokenBuckets(rate=2.0, burst=3.0, max_clients=10)
    assert [buckets.take("a", 0.0) for _ in range(3)] == [None, None, None]
    refused = buckets.take("a", 0.0)
    assert refused == RateLimited(0.5)  # one request's worth at 2/s, told as 1 s
    assert buckets.take("a", 0.5) is None  # refilled one
    assert buckets.take("a", 0.5) == RateLimited(0.5, hold_s=0.5)  # back before the 1 s it was told
    assert [buckets.take("a", 100.0) for _ in range(3)] == [None, None, None]  # never above the burst
    assert isinstance(buckets.take("a", 100.0), RateLimited)


def test_a_client_over_its_rate_gets_429_with_retry_after_unread_and_unrouted_while_another_gets_200() -> (
    None
):
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused)
    assert [_call(app, "10.0.0.1")[0] for _ in range(4)] == [200] * 4
    status, headers = _call(app, "10.0.0.1")
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert inner.calls == 4  # the refused one reached nothing behind the limit
    for _ in range(50):  # a client that asks again at once keeps being refused, for a counter each
        assert _call(app, "10.0.0.1")[0] == 429
    assert inner.calls == 4 and refused == ["client_rate"] * 51
    assert clock.holds == [1.0] * 50  # asked again before its Retry-After: each answer held till then
    assert _call(app, "10.0.0.2")[0] == 200  # another client meanwhile
    clock.now += 0.5
    assert _call(app, "10.0.0.1")[0] == 200  # the first one's rate came back
    assert inner.calls == 6


def test_the_table_of_clients_stays_bounded_with_ten_thousand_addresses_and_keeps_the_flooder() -> None:
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused, max_clients=1000)
    for _ in range(4):
        _call(app, "10.9.9.9")
    assert _call(app, "10.9.9.9")[0] == 429
    buckets = app.anonymous
    assert buckets is not None
    for i in range(10_000):
        buckets.take(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", clock.now)
        if i % 100 == 0:
            assert _call(app, "10.9.9.9")[0] == 429  # recently used: never the one dropped
    assert len(buckets) == 1000


def test_a_client_that_honours_retry_after_is_never_held_and_held_answers_are_bounded() -> None:
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused, rate=0.5, burst=1.0)
    assert _call(app, "10.0.0.1")[0] == 200
    status, headers = _call(app, "10.0.0.1")
    assert status == 429 and headers[b"retry-after"] == b"2"
    clock.now += 2.0  # waits what it was told
    assert _call(app, "10.0.0.1")[0] == 200
    assert _call(app, "10.0.0.1")[0] == 429 and clock.holds == []
    app.held = app.max_held  # as many held as allowed: the next is answered at once
    assert _call(app, "10.0.0.1")[0] == 429 and clock.holds == []
    app.held = 0
    assert _call(app, "10.0.0.1")[0] == 429 and clock.holds == [2.0]


def test_requests_with_the_token_are_exempt_by_default_and_a_wrong_token_counts_as_none() -> None:
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused)
    for _ in range(4):
        _call(app, "127.0.0.1")
    assert _call(app, "127.0.0.1")[0] == 429
    assert _call(app, "127.0.0.1", token="not-the-token-0123456789")[0] == 429
    assert all(_call(app, "127.0.0.1", token=TOKEN)[0] == 200 for _ in range(200))


def test_the_token_holders_limit_is_its_own_bucket_per_address() -> None:
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused, token_rate=10.0, token_burst=20.0)
    for _ in range(4):
        _call(app, "127.0.0.1")
    assert _call(app, "127.0.0.1")[0] == 429  # the token-less flood from this address...
    assert [_call(app, "127.0.0.1", token=TOKEN)[0] for _ in range(20)] == [
        200
    ] * 20  # ...is not the holder's
    status, headers = _call(app, "127.0.0.1", token=TOKEN)
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert refused == ["client_rate", "token_client_rate"]
    clock.now += 0.1
    assert _call(app, "127.0.0.1", token=TOKEN)[0] == 200
    assert _call(app, "127.0.0.1")[0] == 429  # 0.1 s at 2/s: not yet a whole token-less request


def test_rate_limit_settings_are_checked_and_zero_turns_the_limit_off(tmp_path: Path) -> None:
    with pytest.raises(ConfigInvalid, match=r"limits\.client_rate"):
        config_from_mapping({"limits": {"client_rate": -1}})
    with pytest.raises(ConfigInvalid, match=r"limits\.token_client_burst"):
        config_from_mapping({"limits": {"token_client_rate": 5}})
    off = config_from_mapping({"limits": {"client_rate": 0}}).limits
    assert off.client_rate == 0
    inner, clock, refused = Inner(), Clock(), []
    app = _limit(inner, clock, refused, rate=0.0)
    assert all(_call(app, "10.0.0.1")[0] == 200 for _ in range(100)) and not refused


def _stored(app: Any) -> int:
    from infersight.monitor.store.tables import requests

    app.state.service.writer.flush()
    with app.state.service.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())


def test_the_app_refuses_over_rate_first_counts_it_and_writes_no_record(tmp_path: Path) -> None:
    limits = LimitsConfig(client_rate=0.001, client_burst=2)  # two requests, then none for 1000 s
    app = create_app(config(tmp_path, limits=limits))
    other = TestClient(
        app, raise_server_exceptions=False, client=("10.1.1.2", 5000)
    )  # the lifespan runs once
    with TestClient(app, raise_server_exceptions=False, client=("10.1.1.1", 5000)) as flooder:
        body = {"prompt": "hello", "max_tokens": 4}
        first = [flooder.post("/v1/completions", json=body).status_code for _ in range(2)]
        assert 429 not in first
        stored = _stored(app)
        answers = [flooder.post("/v1/completions", json=body)]  # (asked again, it would be held)
        assert {r.status_code for r in answers} == {429}
        assert int(answers[0].headers["retry-after"]) >= 900
        assert answers[0].json()["error"]["type"] == "rate_limited"
        assert _stored(app) == stored  # counted, not recorded
        assert other.get("/healthz").status_code == 200
        metrics = other.get("/metrics", headers=auth()).text
    assert 'infersight_http_refused_total{reason="client_rate"} 1.0' in metrics


def test_infersight_serve_does_not_let_a_loopback_client_escape_its_rate_with_x_forwarded_for(
    tmp_path: Path,
) -> None:
    limits = LimitsConfig(client_rate=0.001, client_burst=2)
    app = create_app(config(tmp_path, limits=limits))
    options = server_options(limits.header_timeout_s, limits.max_connections_per_client)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=120.0)
        assert server.started, "uvicorn did not start"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            statuses = [
                client.get("/healthz", headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code
                for i in range(3)
            ]
    finally:
        server.should_exit = True
        thread.join(60)
    assert statuses == [200, 200, 429]


class Shedding:
    """The app behind the limit refusing as the length breaker does (503 + Retry-After) for
    prompts marked long, answering the others; `gate` holds a request until it is set."""

    def __init__(self, retry_after: int = 2) -> None:
        self.retry_after = retry_after
        self.gate: asyncio.Event | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        if self.gate is not None and b"wait" in body:
            await self.gate.wait()
        if b"long" in body:
            headers = [(b"retry-after", str(self.retry_after).encode())]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
        else:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _post(app: Any, addr: str, body: bytes) -> int:
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "client": (addr, 1)}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


def test_a_client_back_before_a_sheds_retry_after_gets_its_next_503_only_then() -> None:
    clock, refused = Clock(), []
    app = _limit(Shedding(retry_after=2), clock, refused, rate=1000.0, burst=1000.0)  # the rate never bites
    assert asyncio.run(_post(app, "10.0.0.1", b"long")) == 503 and clock.holds == []
    clock.now += 0.01  # asks again 10 ms later, ignoring Retry-After: 2
    assert asyncio.run(_post(app, "10.0.0.1", b"long")) == 503 and clock.holds == [pytest.approx(1.99)]
    # its short questions in that window are answered at once, never held
    assert asyncio.run(_post(app, "10.0.0.1", b"short")) == 200 and len(clock.holds) == 1
    # another client is not held for this one's refusals
    assert asyncio.run(_post(app, "10.0.0.2", b"long")) == 503 and len(clock.holds) == 1
    clock.now += 2.5  # waited what it was told: not held
    assert asyncio.run(_post(app, "10.0.0.1", b"long")) == 503 and len(clock.holds) == 1
    assert refused == []  # none of these was the limit's own refusal


def test_requests_already_in_flight_when_a_client_is_refused_are_not_held() -> None:
    clock, refused = Clock(), []
    inner = Shedding(retry_after=3)
    app = _limit(inner, clock, refused, rate=1000.0, burst=1000.0)

    async def scenario() -> list[int]:
        inner.gate = asyncio.Event()
        in_flight = asyncio.ensure_future(_post(app, "10.0.0.1", b"long wait"))  # arrives first
        await asyncio.sleep(0)
        clock.now += 0.1
        first = await _post(app, "10.0.0.1", b"long")  # refused: told to come back in 3 s
        clock.now += 0.1
        inner.gate.set()
        return [first, await in_flight]

    assert asyncio.run(scenario()) == [503, 503]
    assert clock.holds == []  # it was sent before the client was told anything
