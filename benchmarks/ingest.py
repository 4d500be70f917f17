"""Ingest throughput: events per second accepted by `POST /api/v1/events` from several
concurrent SDK senders (the SDK's own `HttpSink`, one process each), 10% of events with
prompt and response text (Banking77 utterances, repeated unless `--unique-texts`), and the
service's resident memory over the run.

    .venv/bin/python benchmarks/ingest.py --duration 600 --senders 4 --batch 1000

The service runs as `infersight serve` in its own process (SQLite in a temp dir, drift and
alerts on, as deployed). Each sender builds `InferenceRecord`s and hands batches to
`HttpSink` in a loop. Reported: accepted events/s (senders' count and the service's own
counter), rows committed, texts offered to and skipped by the embedding reservoir, the
service's CPU per event (with and without the streaming embed job's, which is a budget per
second, `drift.embed_cpu`, not a cost per event), and the service's RSS every `--rss-every`
seconds (first and last minute compared).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

TOKEN = "benchmark-token-" + "x" * 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompt(rng: random.Random, texts: list[str], unique: bool, prefix: str, n: int) -> str:
    """A Banking77 utterance; with `unique`, made distinct by a suffix (no embedding cache hits;
    the response too, `_response`)."""
    text = rng.choice(texts)
    return f"{text} (ref {prefix}-{n})" if unique else text


def _response(unique: bool, prefix: str, n: int) -> str:
    return (
        f"you can do that in the app under cards (ref {prefix}-{n})"
        if unique
        else "you can do that in the app under cards"
    )


def _sender(
    url: str, batch: int, seconds: float, texts: list[str], seed: int, out: Any, unique: bool = False
) -> None:
    from infersight.monitor.records import InferenceRecord
    from infersight.monitor.sdk import HttpSink

    sink = HttpSink(url, token=TOKEN, timeout_s=30.0, retries=5)
    rng = random.Random(seed)
    prefix = uuid.uuid4().hex[:12]
    sent = refused = batches = 0
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.time()
        records = []
        for _ in range(batch):
            n += 1
            text = rng.random() < 0.10
            prompt = _prompt(rng, texts, unique, prefix, n) if text else None
            records.append(InferenceRecord(
                request_id=f"{prefix}-{n}", model="mixtral_banking", model_version="mixtral_banking_int8-v1.2",
                started_at=now, duration_s=rng.uniform(0.05, 2.0), ttft_s=rng.uniform(0.01, 0.2),
                tpot_s=rng.uniform(0.005, 0.05), queue_s=rng.uniform(0, 0.05), prompt_tokens=rng.randint(5, 60),
                output_tokens=rng.randint(1, 200), prompt=prompt,
                response=(_response(unique, prefix, n) if text else None), source="sdk",
            ))  # fmt: skip
        refused += sink(records)
        sent += len(records)
        batches += 1
    sink.close()
    out.put({"sent": sent, "refused": refused, "batches": batches})


def _raw_sender(
    url: str, batch: int, seconds: float, texts: list[str], seed: int, out: Any, unique: bool = False
) -> None:
    """The same wire format built with orjson and posted with httpx: measures the endpoint,
    not the SDK's serialisation (`--raw`)."""
    import orjson

    rng = random.Random(seed)
    prefix = uuid.uuid4().hex[:12]
    sent = refused = batches = n = 0
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30.0, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        while time.monotonic() < deadline:
            now = time.time()
            events = []
            for _ in range(batch):
                n += 1
                text = rng.random() < 0.10
                events.append({
                    "request_id": f"{prefix}-{n}", "model": "mixtral_banking", "model_version": "mixtral_banking_int8-v1.2",
                    "started_at": now, "duration_s": rng.uniform(0.05, 2.0), "ttft_s": rng.uniform(0.01, 0.2),
                    "tpot_s": rng.uniform(0.005, 0.05), "queue_s": rng.uniform(0, 0.05), "prompt_tokens": rng.randint(5, 60),
                    "output_tokens": rng.randint(1, 200), "prompt": _prompt(rng, texts, unique, prefix, n) if text else None,
                    "response": _response(unique, prefix, n) if text else None, "source": "sdk",
                })  # fmt: skip
            r = client.post(
                url, content=orjson.dumps({"events": events}), headers={"content-type": "application/json"}
            )
            if r.status_code == 200:
                refused += len(r.json()["rejected"])
                sent += batch
                batches += 1
            else:
                time.sleep(0.2)
    out.put({"sent": sent, "refused": refused, "batches": batches})


def _database_cpu() -> float:
    """CPU seconds of the machine's PostgreSQL server processes (the backends included)."""
    total = 0.0
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in ("postgres", "postmaster"):
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else r"(?:\{\})?") + r" ([0-9.e+-]+)"
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rss-every", type=float, default=10.0)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument(
        "--raw",
        action="store_true",
        help="senders post orjson bodies with httpx instead of the SDK's HttpSink",
    )
    ap.add_argument(
        "--no-drift",
        action="store_true",
        help="the service with drift off (drift: {enabled: false}): ingest's CPU without the embedding",
    )
    ap.add_argument(
        "--reservoir",
        type=int,
        help="drift.reservoir: at most this many texts a tick (default: the service's)",
    )
    ap.add_argument(
        "--embed-cpu",
        help="drift.embed_cpu: the streaming embed job's share of one CPU, or 'null' (default: the service's)",
    )
    ap.add_argument(
        "--unique-texts",
        action="store_true",
        help="every prompt distinct (a suffix per event): the embedding cache never hits, each text costs the model",
    )
    ap.add_argument(
        "--database-url",
        help="the store (postgresql://...; its tables are made by the service): the database "
        "server's CPU is reported beside the service's (default: SQLite in a temp dir)",
    )
    args = ap.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    from infersight.monitor import data

    texts = [u.text for u in data.banking77("train")]
    tmp = Path(tempfile.mkdtemp(prefix="infersight-ingest-"))
    port = _free_port()
    drift = "drift:\n  enabled: false\n" if args.no_drift else ""
    if not args.no_drift and (args.reservoir is not None or args.embed_cpu is not None):
        drift = "drift:\n"
        drift += f"  reservoir: {args.reservoir}\n" if args.reservoir is not None else ""
        drift += f"  embed_cpu: {args.embed_cpu}\n" if args.embed_cpu is not None else ""
    store = f"database_url: {json.dumps(args.database_url)}\n" if args.database_url else ""
    (tmp / "config.yaml").write_text(f"data_dir: {tmp / 'data'}\nport: {port}\n{store}{drift}")
    env = {**os.environ, "INFERSIGHT_TOKEN": TOKEN}
    server = subprocess.Popen(
        [sys.executable, "-m", "infersight.monitor.cli", "serve", "--config", str(tmp / "config.yaml"),
         "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            print("the service did not become ready", file=sys.stderr)
            return 1
        proc = psutil.Process(server.pid)
        before = httpx.get(base + "/metrics").text
        queue: mp.Queue[Any] = mp.Queue()
        target = _raw_sender if args.raw else _sender
        senders = [mp.Process(target=target, args=(base + "/api/v1/events", args.batch, args.duration, texts, i, queue, args.unique_texts))
                   for i in range(args.senders)]  # fmt: skip
        t0 = time.monotonic()
        for s in senders:
            s.start()
        rss: list[tuple[float, int]] = []
        cpu0 = proc.cpu_times()
        db0 = _database_cpu() if args.database_url else 0.0
        every = min(args.rss_every, max(0.5, args.duration / 20))
        next_rss = t0
        while any(s.is_alive() for s in senders):  # polled finely: `elapsed` ends when the last sender does
            if time.monotonic() >= next_rss:
                rss.append((round(time.monotonic() - t0, 1), proc.memory_info().rss))
                next_rss += every
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        cpu1 = proc.cpu_times()
        db1 = _database_cpu() if args.database_url else 0.0
        results = [queue.get(timeout=30) for _ in senders]
        after = httpx.get(base + "/metrics").text
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)  # a 10-minute run leaves a database of several GB
    sent = sum(r["sent"] for r in results)
    accepted = _metric(after, "infersight_ingest_events_total", 'outcome="accepted"') - _metric(
        before, "infersight_ingest_events_total", 'outcome="accepted"')  # fmt: skip
    written = _metric(after, "infersight_store_requests_written_total")
    offered = _metric(after, "infersight_drift_texts_offered_total")
    skipped = _metric(after, "infersight_drift_texts_skipped_total")
    # the streaming embed job's CPU (a budget per second, not a cost per event): reported
    # beside the whole process's, and the process's without it per event
    embed_cpu = _metric(after, "infersight_drift_embed_cpu_seconds_total") - _metric(
        before, "infersight_drift_embed_cpu_seconds_total")  # fmt: skip
    service_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    first = [b for t, b in rss if t <= 60] or [rss[0][1]]
    last = [b for t, b in rss if t >= elapsed - 60] or [rss[-1][1]]
    warm = [b for t, b in rss if t >= 120]
    figures = {
        "duration_s": round(elapsed, 1), "senders": args.senders, "sender": "raw" if args.raw else "sdk",
        "batch": args.batch,
        "events_sent": sent, "events_accepted": int(accepted), "rows_written": int(written),
        "accepted_per_s": round(accepted / elapsed), "refused": sum(r["refused"] for r in results),
        "texts_offered": int(offered), "texts_skipped": int(skipped),
        "service_cpu_s": round(service_cpu, 1),
        "service_cpu_us_per_event": round(service_cpu / max(accepted, 1) * 1e6, 2),
        "embed_job_cpu_s": round(embed_cpu, 1), "embed_job_cpu_share": round(embed_cpu / elapsed, 3),
        "service_cpu_us_per_event_without_embed_job": round((service_cpu - embed_cpu) / max(accepted, 1) * 1e6, 2),
        "database_server_cpu_s": round(db1 - db0, 1) if args.database_url else None,
        "embed_capacity_at_end": int(_metric(after, "infersight_drift_embed_capacity")),
        "rss_mib_first_minute_max": round(max(first) / 2**20, 1), "rss_mib_last_minute_max": round(max(last) / 2**20, 1),
        # after the caches filled (the embedding cache, the model, SQLite's pages): flat or not
        "rss_mib_after_2_min_min_max": [round(min(warm) / 2**20, 1), round(max(warm) / 2**20, 1)] if warm else None,
        "rss_mib_series": [(t, round(b / 2**20, 1)) for t, b in rss],
        "cores": os.cpu_count(),
    }  # fmt: skip
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
