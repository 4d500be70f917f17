"""What a client of the embedded runtime can see and cause, over real HTTP (uvicorn on a
loopback port, the demo model, SQLite): during a canary an answer never tells a client
without the token which version served it (so it cannot steer its arm), the token's holder
is told in `x-infersight-version`; a client that hangs up, streamed or not, stops its
generation (its slot is freed long before `max_tokens`) and is recorded as `cancelled`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, wait_for
from conftest import free_port
from infersight.engine.runtime_canary import user_bucket
from infersight.monitor.service import EngineConfig, Service, create_app
from infersight.monitor.store.tables import requests
from sqlalchemy import select

INT8 = "mixtral_banking_int8-v1.0"  # a good candidate: the int8 build of the serving checkpoint
STABLE_NAME = "mixtral_banking"
MAX_TOKENS = 480  # greedy, the demo model writes all of these (about a second on one core)
HEADER = "x-infersight-version"


@dataclass
class Served:
    base: str
    port: int
    service: Service
    events: list[Any]  # the runtime's events, as its subscribers get them

    @property
    def runtime(self) -> Any:
        return self.service.parts.backend.runtime  # type: ignore[union-attr]

    def record(self, request_id: str) -> Any:
        assert self.service.writer is not None
        self.service.writer.flush()
        with self.service.db.connect() as conn:
            return conn.execute(select(requests).where(requests.c.request_id == request_id)).first()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import uvicorn

    tmp = tmp_path_factory.mktemp("client-edge")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    port = free_port()
    cfg = config(tmp, port=port, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=4,
                                                     max_seq_len=512, max_prompt_tokens=256,
                                                     max_tokens_limit=MAX_TOKENS))  # fmt: skip
    service = Service(cfg)
    service.start()
    events: list[Any] = []
    unsubscribe = service.parts.backend.runtime.subscribe(events.append)  # type: ignore[union-attr]
    server = uvicorn.Server(uvicorn.Config(create_app(cfg, service=service), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))  # fmt: skip
    thread = threading.Thread(target=server.run, name="client-edge-uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=60)
        yield Served(f"http://127.0.0.1:{port}", port, service, events)
    finally:
        server.should_exit = True
        thread.join(30)
        unsubscribe()
        service.stop()


def _answers(
    base: str, user: str, headers: dict[str, str]
) -> Iterator[tuple[httpx.Headers, bytes, list[Any]]]:
    """(headers, raw body, JSON objects in it) of each kind of answer: whole and streamed
    completions and chats (with the usage chunk)."""
    chat = {"messages": [{"role": "user", "content": "how do i top up my card"}]}
    completion = {"prompt": "how do i top up my card"}
    with httpx.Client(base_url=base, timeout=60, headers=headers) as client:
        for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            for stream in (False, True):
                req = {**body, "max_tokens": 3, "temperature": 0, "user": user, "stream": stream,
                       **({"stream_options": {"include_usage": True}} if stream else {})}  # fmt: skip
                r = client.post(path, json=req)
                assert r.status_code == 200, r.text
                if stream:
                    events = [
                        line.removeprefix("data: ")
                        for line in r.text.splitlines()
                        if line.startswith("data: ")
                    ]
                    assert events[-1] == "[DONE]"
                    objects = [orjson.loads(e) for e in events[:-1]]
                else:
                    objects = [r.json()]
                yield r.headers, r.content, objects


def test_a_client_without_the_token_cannot_tell_its_canary_arm(served: Served) -> None:
    r = httpx.post(f"{served.base}/api/v1/models/canary", json={"version": INT8, "weight": 0.5}, headers=auth(),
                   timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    try:
        names = [f"customer-{i}" for i in range(200)]
        arms = {INT8: [u for u in names if user_bucket(u, INT8) < 0.5][:3],
                GOOD: [u for u in names if user_bucket(u, INT8) >= 0.5][:3]}  # fmt: skip
        header_names: dict[str, set[frozenset[str]]] = {INT8: set(), GOOD: set()}
        for version, users in arms.items():
            for user in users:
                for headers, raw, objects in _answers(served.base, user, {}):
                    assert HEADER not in headers
                    seen = raw.decode() + " ".join(f"{k}: {v}" for k, v in headers.items())
                    for leak in (GOOD, INT8, "fp32", "int8", "v1.0"):
                        assert leak not in seen, (leak, seen)
                    assert objects and all(o["model"] == STABLE_NAME for o in objects), objects
                    header_names[version].add(frozenset(headers.keys()) - {"date", "content-length"})
        assert header_names[INT8] == header_names[GOOD]  # the same headers on either arm
        # with the token: which version answered, the same one for a user every time
        for version, users in arms.items():
            for user in users:
                for headers, _raw, objects in _answers(served.base, user, auth()):
                    assert headers[HEADER] == version, (user, version)
                    assert all(o["model"] == STABLE_NAME for o in objects)
        status = httpx.get(f"{served.base}/api/v1/models/canary", timeout=30).json()
        assert status["canary_requests"] >= 24 and status["stable_requests"] >= 24  # both arms served
    finally:
        httpx.post(f"{served.base}/api/v1/models/canary/abort", headers=auth(), timeout=120)


def _request_then_hang_up(served: Served, path: str, body: dict[str, Any], started: Callable[[], Any]) -> Any:
    """Send the request on a raw connection, close it ~50 ms after the runtime started it;
    returns what `started` returned."""
    payload = orjson.dumps(body)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")  # fmt: skip
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        sock.sendall(head.encode() + payload)
        value = wait_for(started, timeout=60, interval=0.01)
        time.sleep(0.05)
    return value  # the socket is closed: the client hung up


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/v1/completions", False), ("/v1/chat/completions", False), ("/v1/chat/completions", True)],
)
def test_a_client_that_hangs_up_frees_its_slot_and_is_recorded_cancelled(
    served: Served, path: str, stream: bool
) -> None:
    text = f"my card was declined at the shop {path} {stream}"
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            **({"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text})}  # fmt: skip
    seen = len(served.events)

    def started() -> str | None:
        # other events (a canary's end from the test before, say) may come in between
        return next(
            (e.request_id for e in served.events[seen:] if type(e).__name__ == "RequestStarted"), None
        )

    rid = _request_then_hang_up(served, path, body, started)
    finished = wait_for(lambda: next((e for e in served.events[seen:] if type(e).__name__ == "RequestFinished"
                                      and e.request_id == rid), None), timeout=60)  # fmt: skip
    assert finished.finish_reason == "cancelled" and finished.output_tokens < MAX_TOKENS // 2, finished
    wait_for(lambda: served.runtime.running == 0 and served.runtime.queue_depth == 0, timeout=30)
    record = wait_for(lambda: served.record(rid), timeout=30)
    assert record.error_type == "cancelled" and record.response is None
    assert record.output_tokens is not None and record.output_tokens < MAX_TOKENS // 2
    # the slot serves the next client at once
    r = httpx.post(f"{served.base}/v1/completions", json={"prompt": "card", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2


def test_hang_ups_on_either_canary_arm_enter_none_of_its_checks(served: Served) -> None:
    r = httpx.post(f"{served.base}/api/v1/models/canary", json={"version": INT8, "weight": 0.5}, headers=auth(),
                   timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    controller = served.service.parts.backend.canary_controller  # type: ignore[union-attr]
    try:
        names = [f"leaver-{i}" for i in range(200)]
        users = {INT8: next(u for u in names if user_bucket(u, INT8) < 0.5),
                 GOOD: next(u for u in names if user_bucket(u, INT8) >= 0.5)}  # fmt: skip
        before = {c.name: (c.canary_n, c.stable_n) for c in controller.analysis.checks()}
        for version, user in users.items():
            seen = len(served.events)
            body = {
                "prompt": "my card was declined",
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "user": user,
            }

            def started(seen: int = seen) -> Any:
                return next((e for e in served.events[seen:] if type(e).__name__ == "RequestStarted"), None)

            event = _request_then_hang_up(served, "/v1/completions", body, started)
            assert event.model_version == version  # each arm got one
            finished = wait_for(lambda e=event: next((f for f in served.events if type(f).__name__ ==
                                                      "RequestFinished" and f.request_id == e.request_id), None),
                                timeout=60)  # fmt: skip
            assert finished.finish_reason == "cancelled" and finished.output_tokens < MAX_TOKENS // 2
        assert controller.served == {True: 1, False: 1}  # both were seen by the canary
        # neither its latency nor its cut-short length (nor an error) reached a check
        assert {c.name: (c.canary_n, c.stable_n) for c in controller.analysis.checks()} == before
    finally:
        httpx.post(f"{served.base}/api/v1/models/canary/abort", headers=auth(), timeout=120)
