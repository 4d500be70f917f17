"""The ingest path's CPU per event, without HTTP sockets, senders or the embedding model.

    .venv/bin/python benchmarks/ingest_path.py [--batches 200] [--batch 1000] [--concurrency 4]
        [--database-url postgresql+psycopg://...]

`benchmarks/ingest.py` measures the deployed service under SDK senders on the same machine:
its CPU per event mixes the path with what does not scale with events (the drift model
embedding a fixed number of texts per tick, the schedulers) and with how fast the senders,
sharing the cores, can send. This one drives the real FastAPI app in this process through
its ASGI interface (middleware, bearer token, body limit, orjson, validation, the record
pipeline and its observers, the text reservoir, the group-commit writer to SQLite or the
given database), with `--concurrency` batches in flight as several senders would have, and
reports the process's CPU time (all threads, the writer's included) per accepted event.
Drift is off (its model is the part the embedding benchmarks measure); 10% of events carry
prompt and response text, as in `ingest.py`.

The same script runs on another checkout with `benchmarks/before_after.py` (copy it into
that checkout's benchmarks/ if it has none): the app and its API are the same in both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

TOKEN = "benchmark-token-" + "x" * 16


def _bodies(n: int, batch: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    texts = ["how do I activate my card", "my transfer has not arrived", "why was I charged twice"]
    out = []
    for _ in range(n):
        now, prefix = time.time(), uuid.uuid4().hex[:12]
        events = []
        for i in range(batch):
            text = rng.random() < 0.10
            events.append({
                "request_id": f"{prefix}-{i}", "model": "mixtral_banking", "model_version": "mixtral_banking_int8-v1.2",
                "started_at": now - rng.uniform(0, 2), "duration_s": rng.uniform(0.05, 2.0), "ttft_s": rng.uniform(0.01, 0.2),
                "tpot_s": rng.uniform(0.005, 0.05), "queue_s": rng.uniform(0, 0.05), "prompt_tokens": rng.randint(5, 60),
                "output_tokens": rng.randint(1, 200), "prompt": rng.choice(texts) if text else None,
                "response": "you can do that in the app under cards" if text else None, "source": "sdk",
            })  # fmt: skip
        out.append(orjson.dumps({"events": events}))
    return out


async def _post(app: Any, body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/api/v1/events", "raw_path": b"/api/v1/events", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {TOKEN}".encode()),
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never hangs up
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from infersight.monitor.service import ServiceConfig, create_app
    from infersight.monitor.service.config import DriftConfig

    tmp = Path(tempfile.mkdtemp(prefix="infersight-ingest-path-"))
    config = ServiceConfig(
        data_dir=tmp / "data", token=TOKEN, drift=DriftConfig(enabled=False), database_url=args.database_url
    )
    app = create_app(config)
    bodies = _bodies(args.batches + args.warmup, args.batch, args.seed)
    async with app.router.lifespan_context(app):
        for body in bodies[: args.warmup]:
            status, answer = await _post(app, body)
            assert status == 200, (status, answer)
        queue = list(bodies[args.warmup :])
        accepted = 0

        async def sender() -> None:
            nonlocal accepted
            while queue:
                status, answer = await _post(app, queue.pop())
                if status != 200:
                    raise SystemExit(f"ingest answered {status}: {answer[:200]!r}")
                accepted += orjson.loads(answer)["accepted"]

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(args.concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"accepted": accepted, "cpu_s": cpu, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp dir")
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; python {platform.python_version()}")
    r = asyncio.run(_run(args))
    print(
        f"accepted {r['accepted']} events in {r['wall_s']:.1f} s: {r['accepted'] / r['wall_s']:.0f} events/s; "
        f"process CPU {r['cpu_s']:.2f} s: {r['cpu_s'] / r['accepted'] * 1e6:.1f} us/event"
    )


if __name__ == "__main__":
    main()
