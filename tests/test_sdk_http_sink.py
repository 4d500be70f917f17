"""HttpSink against a local HTTP server that validates `POST /api/v1/events` as the sidecar
does (bearer token, `InferenceRecord.from_json` per event, the contract's answer)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from infersight.monitor.records import InferenceRecord, InvalidRecord
from infersight.monitor.sdk import HttpSink, Monitor, SinkRejected, SinkUnavailable

from tests.conftest import free_port

TOKEN = "s3cret-token"


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.accepted: list[InferenceRecord] = []
        self.statuses: list[int] = []  # answers to give first (e.g. 503), then 200
        self.reject_models: set[str] = set()  # refuse events of these models (as invalid)
        self.requests = 0


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, *args: Any) -> None:
        return

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.server.requests += 1
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/api/v1/events":
            return self._answer(404, {"detail": "not found"})
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._answer(401, {"detail": "bad token"})
        if self.server.statuses:
            return self._answer(self.server.statuses.pop(0), {"detail": "try later"})
        if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
            return self._answer(422, {"detail": [{"loc": ["body", "events"], "msg": "required"}]})
        accepted, rejected = 0, []
        for i, event in enumerate(payload["events"]):
            try:
                record = InferenceRecord.from_json(event)
                if record.model in self.server.reject_models:
                    raise InvalidRecord("model", "unknown model")
            except InvalidRecord as exc:
                rejected.append({"index": i, "field": exc.field, "reason": exc.reason})
                continue
            self.server.accepted.append(record)
            accepted += 1
        return self._answer(200, {"accepted": accepted, "rejected": rejected})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(free_port())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: Receiver) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/api/v1/events"


def test_sampled_calls_arrive_at_the_ingest_endpoint_as_valid_records(receiver: Receiver) -> None:
    sink = HttpSink(_url(receiver), token=TOKEN)
    monitor = Monitor(sink=sink, sample_rate=1.0, batch_size=4)

    @monitor.track(model="fraud", model_version="v2")
    def answer(prompt: str) -> str:
        return "ok: " + prompt

    for i in range(10):
        answer(f"txn {i}")
    assert monitor.flush(10)
    assert sorted(r.prompt or "" for r in receiver.accepted) == sorted(f"txn {i}" for i in range(10))
    assert {(r.model, r.model_version, r.source) for r in receiver.accepted} == {("fraud", "v2", "sdk")}
    assert monitor.counters.sent_total() == 10 and receiver.requests >= 3
    sink.close()


def test_unavailable_receiver_is_retried_with_backoff_then_delivered(receiver: Receiver) -> None:
    receiver.statuses = [503, 502]
    delays: list[float] = []
    sink = HttpSink(_url(receiver), token=TOKEN, retries=3, backoff_s=0.5, sleep=delays.append)
    record = InferenceRecord("r1", "m", "v", started_at=1.0, duration_s=0.1)
    assert sink([record]) == 0
    assert receiver.accepted == [record]
    assert len(delays) == 2 and 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0


def test_retry_after_is_honoured_within_the_cap(receiver: Receiver) -> None:
    receiver.statuses = [429]
    delays: list[float] = []
    sink = HttpSink(_url(receiver), token=TOKEN, max_backoff_s=4.0, sleep=delays.append)
    assert sink([InferenceRecord("r", "m", "v", started_at=1.0, duration_s=0.1)]) == 0
    assert delays == [pytest.approx(0.0, abs=4.0)]


def test_wrong_token_is_refused_at_once_and_counted_as_a_sink_error(receiver: Receiver) -> None:
    sink = HttpSink(_url(receiver), token="wrong", sleep=lambda s: None)
    with pytest.raises(SinkRejected, match="401"):
        sink([InferenceRecord("r", "m", "v", started_at=1.0, duration_s=0.1)])
    assert receiver.requests == 1  # not retried
    monitor = Monitor(sink=sink, sample_rate=1.0)
    monitor.track(model="m")(lambda p: p)("x")
    assert monitor.flush(5)
    assert monitor.counters.value("dropped", "sink_error") == 1


def test_unreachable_receiver_gives_up_after_the_retries() -> None:
    sink = HttpSink(f"http://127.0.0.1:{free_port()}/api/v1/events", retries=2, sleep=lambda s: None)
    with pytest.raises(SinkUnavailable, match="3 attempts"):
        sink([InferenceRecord("r", "m", "v", started_at=1.0, duration_s=0.1)])


def test_records_the_receiver_refuses_are_counted(receiver: Receiver) -> None:
    receiver.reject_models = {"retired"}
    monitor = Monitor(sink=HttpSink(_url(receiver), token=TOKEN), sample_rate=1.0)
    monitor.track(model="retired")(lambda p: p)("a")
    monitor.track(model="live")(lambda p: p)("b")
    assert monitor.flush(5)
    assert [r.model for r in receiver.accepted] == ["live"]
    assert monitor.counters.value("dropped", "server_rejected") == 1
    assert monitor.counters.sent_total() == 1


class _Counting(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.requests = inner, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        answer = self.inner.handle_request(request)  # the test client's: read into a plain response
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.read())


def test_the_services_partial_success_is_counted_once_and_not_retried(tmp_path: Path) -> None:
    """Against the real service: a batch with a record past `limits.max_duration_s` is
    answered 200 with that record refused by index; the sink counts it and sends no retry,
    and the service keeps the others."""
    from _service_support import config, running
    from infersight.monitor.records import build_record

    with running(config(tmp_path)) as (app, client):
        transport = _Counting(client._transport)
        sink = HttpSink("http://testserver/api/v1/events", token="test-token-0123456789abcdef",
                        transport=transport, sleep=lambda s: pytest.fail("retried"))  # fmt: skip
        good = [InferenceRecord(f"r{i}", "m", "v", started_at=1.7e9, duration_s=0.1) for i in range(2)]
        endless = build_record("r-bad", "m", "v", 1.7e9, 2.0**64, None, None, None, None, None, None, None,
                               None, "sdk")  # fmt: skip
        assert sink([good[0], endless, good[1]]) == 1
        assert transport.requests == 1
        assert app.state.service.writer.flush()
        monitor = Monitor(sink=sink, sample_rate=1.0)
        monitor.track(model="m")(lambda p: p)("x")  # and the SDK's own calls still go through
        assert monitor.flush(5) and monitor.counters.sent_total() == 1
