"""Under overload and hostile input `infersight serve` stays responsive (issue 22, section 1):
the real app under uvicorn with `infersight serve`'s connection settings, the demo model.

- a 7 MB prompt (no token) is refused 400 without being tokenized, while /healthz and a
  small completion answer; a long prompt within the bound is tokenized off the event loop;
- a flood of long requests on a bounded queue gets 429 + Retry-After (outcome
  `overloaded`), while a short one is served;
- 500 half-open connections from one address are closed (over the per-address cap at
  once, the rest at the header timeout) while other clients are answered.

Behaviour is asserted by outcome and by order (the loop ran while a prompt was tokenized),
never by how fast this machine is."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import TOKEN, auth, config, wait_for
from infersight.monitor.service import create_app
from infersight.monitor.service.config import EngineConfig, LimitsConfig, config_from_mapping
from infersight.monitor.service.overload import PromptEncoder, PromptOverCharacters, server_options

INT8 = "mixtral_banking_int8-v1.0"
SHORT = "Where is my new card? It has not arrived."
LONG = " ".join(["I was charged twice for one purchase and the app shows an error."] * 12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(cfg: Any) -> Iterator[tuple[Any, str, Any]]:
    """The app under uvicorn with `infersight serve`'s options; yields (app, base URL, guard)."""
    app = create_app(cfg)
    port = _free_port()
    options = server_options(cfg.limits.header_timeout_s, cfg.limits.max_connections_per_client)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=120.0)
        assert server.started, "uvicorn did not start"
        yield app, f"http://127.0.0.1:{port}", options["http"].connection_guard
    finally:
        server.should_exit = True
        thread.join(60)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return private_copy(shared_demo_registry(tmp_path_factory), tmp_path_factory.mktemp("ovl") / "registry")


def test_a_7mb_prompt_without_the_token_is_refused_400_untokenized_while_healthz_and_a_small_completion_answer(
    tmp_path: Path, registry: Path
) -> None:
    engine = EngineConfig(registry=registry, version=GOOD, max_batch_size=4, max_seq_len=512,
                          max_prompt_tokens=256, max_tokens_limit=16)  # fmt: skip
    huge = "hello world " * (7 * 1024 * 1024 // 12)  # 7 MB, under the 8 MiB body limit
    with (
        _serve(config(tmp_path, engine=engine)) as (_app, url, _guard),
        httpx.Client(timeout=120.0) as client,
    ):
        answers: list[httpx.Response] = []

        def flood() -> None:
            for _ in range(3):
                answers.append(client.post(f"{url}/v1/completions", json={"prompt": huge, "max_tokens": 4}))

        sender = threading.Thread(target=flood)
        sender.start()
        during = []
        while sender.is_alive() or not during:  # asked while the big prompts arrive
            during.append(client.get(f"{url}/healthz").status_code)
            small = client.post(f"{url}/v1/completions", json={"prompt": SHORT, "max_tokens": 2})
            during.append(small.status_code)
        sender.join()
    assert set(during) == {200}
    assert [r.status_code for r in answers] == [400, 400, 400]
    error = answers[0].json()["error"]
    assert error["field"] == "body.prompt" and error["code"] == "context_length_exceeded"
    assert "max_prompt_chars" in error["message"]  # refused on its length in characters: not tokenized


def test_a_long_prompt_within_the_bound_is_tokenized_while_the_event_loop_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tokenizers import Tokenizer

    demo = shared_demo_registry(tmp_path_factory)
    tokenizer = Tokenizer.from_file(str(demo / "checkpoints" / "demo" / "tokenizer.json"))
    text = "hello world " * 100_000  # 1.2 MB: hundreds of ms of tokenizing (the GIL released)
    encoder = PromptEncoder(max_prompt_tokens=1_000_000)

    async def scenario() -> tuple[int, int]:
        ticks = 0
        task = asyncio.ensure_future(encoder.encode(tokenizer, text))
        while not task.done():
            await asyncio.sleep(0)
            ticks += 1
        return len(await task), ticks

    try:
        n, ticks = asyncio.run(scenario())
        assert n == 200_000
        assert ticks > 1  # the loop went on meanwhile (tokenizer.encode holds the GIL: it would be 1)
        with pytest.raises(PromptOverCharacters, match="max_prompt_chars=1800"):
            asyncio.run(PromptEncoder(max_prompt_tokens=18).encode(tokenizer, "x" * 1801))
    finally:
        encoder.close()


def test_a_flood_of_long_requests_on_a_bounded_queue_gets_429_and_a_short_one_is_served(
    tmp_path: Path, registry: Path
) -> None:
    parsed = config_from_mapping(
        {
            "engine": {"registry": str(registry), "max_seq_len": 512},
            "routing": {
                "fast": {"version": INT8, "sla_ms": 600_000, "max_prompt_tokens": 32, "max_new_tokens": 8},
                "standard": {"version": GOOD, "sla_ms": 600_000},
            },
        }
    )  # fmt: skip  the SLAs out of reach: admission alone is under test here
    engine = dataclasses.replace(parsed.engine, max_batch_size=4, max_prompt_tokens=400, max_tokens_limit=64,  # type: ignore[arg-type]
                                 max_queue=4)  # fmt: skip
    # one address sends the flood: the per-client rate off, admission alone is under test
    # (tests/test_rate_limit.py tests the rate)
    cfg = config(tmp_path, engine=engine, routing=parsed.routing, limits=LimitsConfig(client_rate=0))
    with (
        _serve(cfg) as (_app, url, _guard),
        httpx.Client(timeout=300.0, limits=httpx.Limits(max_connections=64)) as client,
    ):

        def ask(prompt: str, max_tokens: int) -> httpx.Response:
            return client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})

        with ThreadPoolExecutor(max_workers=25) as pool:
            flood = [pool.submit(ask, LONG, 64) for _ in range(100)]
            refused = next(f for f in flood if f.result().status_code == 429).result()
            short = ask(SHORT, 4)  # while the long ones still run and wait: the fast path's queue is free
            answers = [f.result() for f in flood]
        statuses = [r.status_code for r in answers]
        assert short.status_code == 200
        assert set(statuses) <= {200, 429} and statuses.count(429) >= 1
        assert int(refused.headers["retry-after"]) >= 1
        assert (
            refused.json()["error"]["code"] == "overloaded"
            and "max_queue=4" in refused.json()["error"]["message"]
        )

        def overloaded() -> float:
            for line in client.get(f"{url}/metrics").text.splitlines():
                if line.startswith("infersight_client_outcomes_total{") and 'outcome="overloaded"' in line:
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        wait_for(lambda: overloaded() >= statuses.count(429), timeout=30.0)  # its own outcome, no error
        metrics = client.get(f"{url}/metrics").text
        assert not [ln for ln in metrics.splitlines() if ln.startswith("gen_ai_server_request_errors_total{")]
        assert 'infersight_route_requests_total{path="standard",reason="overloaded"}' in metrics
        stored = client.get(f"{url}/api/v1/overview", headers=auth(TOKEN))
        assert stored.status_code == 200


def test_half_open_connections_are_closed_and_other_clients_are_answered(tmp_path: Path) -> None:
    limits = LimitsConfig(header_timeout_s=1.0, max_connections_per_client=50)
    with _serve(config(tmp_path, limits=limits)) as (_app, url, guard), contextlib.ExitStack() as stack:
        port = int(url.rsplit(":", 1)[1])
        sockets = []
        for _ in range(500):  # from 127.0.0.2: another client address on loopback
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
            sockets.append(s)
        assert httpx.get(f"{url}/healthz", timeout=60.0).status_code == 200  # another address: answered
        for s in sockets:
            s.settimeout(60.0)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1024) == b""  # closed by the server, nothing answered
        assert guard.refused == 450 and guard.closed_idle == 50
        assert guard.open.get("127.0.0.2", 0) == 0


def test_infersight_serve_closes_half_open_connections_over_the_cap_and_at_the_header_timeout(
    tmp_path: Path,
) -> None:
    """The command itself (a process of its own): its uvicorn runs the guarded protocol."""
    import os
    import subprocess
    import sys

    port = _free_port()
    (tmp_path / "infersight.yaml").write_text(
        "limits: {header_timeout_s: 1.0, max_connections_per_client: 5}\ndrift: {enabled: false}\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "infersight.monitor.cli", "serve", "--config", str(tmp_path / "infersight.yaml"),
         "--data-dir", str(tmp_path / "data"), "--port", str(port), "--log-level", "error"],
        env={**os.environ, "INFERSIGHT_TOKEN": TOKEN}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert server.poll() is None, "infersight serve exited"
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/healthz", timeout=5.0).status_code == 200
        return False

    try:
        wait_for(ready, timeout=120.0, interval=0.2)
        with contextlib.ExitStack() as stack:
            sockets = []
            for _ in range(10):
                s = stack.enter_context(socket.socket())
                s.bind(("127.0.0.2", 0))
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers never end
                sockets.append(s)
            assert httpx.get(f"{url}/healthz", timeout=60.0).status_code == 200  # another address
            for s in sockets:
                s.settimeout(60.0)
                with contextlib.suppress(ConnectionResetError):
                    assert s.recv(1024) == b""  # closed, nothing answered
    finally:
        server.terminate()
        server.wait(60)
