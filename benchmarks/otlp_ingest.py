"""OTLP ingest against SDK ingest: spans per second accepted by `POST /v1/traces` from the
real OpenTelemetry exporter (OTLP/HTTP protobuf, `BatchSpanProcessor`), and the service's
CPU per 1,000 spans, next to the same figures for `POST /api/v1/events` fed by the SDK's
`HttpSink`, in one run, the two alternated.

    .venv/bin/python benchmarks/otlp_ingest.py --phase-s 15 --rounds 2 --senders 2 [--raw] [--no-drift]

The service runs as `infersight serve` in its own process (SQLite in a temp dir, drift and
alerts on, as deployed). Each phase starts `--senders` sender processes of one kind for
`--phase-s` seconds: OTLP senders make GenAI chat spans with the OpenTelemetry SDK (the
current semantic conventions, as OpenLLMetry writes them; 10% with prompt and answer) and
export them in batches of `--batch`; SDK senders make the same calls as `InferenceRecord`s
and send batches of `--batch` with `HttpSink`. Counted on the service's side (its
/metrics): what it accepted; its CPU from /proc (user + system) over the phase.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import re
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
QUESTIONS = ["how do I activate my new card", "why was my transfer declined", "what is the exchange rate",
             "my card payment was charged twice", "can I change my PIN in the app"]  # fmt: skip
ANSWER = "You can do that in the app, under Cards."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _attributes(rng: random.Random) -> dict[str, Any]:
    """A chat span's attributes as OpenLLMetry writes them; 10% with prompt and answer."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "mixtral_banking",
        "gen_ai.response.model": "mixtral_banking_int8-v1.2", "gen_ai.usage.input_tokens": rng.randint(5, 60),
        "gen_ai.usage.output_tokens": rng.randint(1, 200), "gen_ai.response.finish_reasons": ("stop",),
    }  # fmt: skip
    if rng.random() < 0.10:
        q = rng.choice(QUESTIONS)
        attributes["gen_ai.input.messages"] = json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": q}]}]
        )
        attributes["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": ANSWER}]}]
        )
    return attributes


def _otlp_sender(base: str, batch: int, seconds: float, seed: int) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind

    exporter = OTLPSpanExporter(
        endpoint=f"{base}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    provider = TracerProvider(
        resource=Resource.create({"service.name": "bench-app", "service.version": "v1"})
    )
    # a queue deep enough that the producer waits on the exporter rather than dropping spans
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=8 * batch, max_export_batch_size=batch,
                                                   schedule_delay_millis=50))  # fmt: skip
    tracer = provider.get_tracer("bench")
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        tracer.start_span("chat mixtral_banking", kind=SpanKind.CLIENT, attributes=_attributes(rng)).end()
        n += 1
        if n % batch == 0:
            time.sleep(0)  # let the export thread run
    provider.shutdown()


def _otlp_raw_sender(base: str, batch: int, seconds: float, seed: int) -> None:
    """Exports made once by the SDK's own encoder from real SDK spans, posted again and again
    with fresh trace ids: the endpoint's capacity, without the Python SDK's cost of making
    and encoding spans (`--raw`)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    rng = random.Random(seed)
    for _ in range(batch):
        tracer.start_span("chat mixtral_banking", attributes=_attributes(rng)).end()
    export = encode_spans(memory.get_finished_spans())
    spans = [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            trace_id = os.urandom(16)
            for span in spans:
                span.trace_id = trace_id
            r = client.post(f"{base}/v1/traces", content=export.SerializeToString(), headers=headers)
            if r.status_code != 200:
                time.sleep(0.05)


def _sdk_sender(base: str, batch: int, seconds: float, seed: int) -> None:
    from infersight.monitor.records import InferenceRecord
    from infersight.monitor.sdk import HttpSink

    sink = HttpSink(f"{base}/api/v1/events", token=TOKEN, timeout_s=30.0, retries=5)
    rng = random.Random(seed)
    prefix = uuid.uuid4().hex[:12]
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        records = []
        for _ in range(batch):
            n += 1
            text = rng.random() < 0.10
            records.append(InferenceRecord(
                request_id=f"{prefix}-{n}", model="mixtral_banking", model_version="mixtral_banking_int8-v1.2",
                started_at=time.time(), duration_s=rng.uniform(0.05, 2.0), prompt_tokens=rng.randint(5, 60),
                output_tokens=rng.randint(1, 200), prompt=rng.choice(QUESTIONS) if text else None,
                response=ANSWER if text else None, source="sdk",
            ))  # fmt: skip
        sink(records)
    sink.close()


def _accepted(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out = {}
    for name, pattern in (("otlp", r'^infersight_otlp_spans_total\{outcome="accepted"\} (\S+)$'),
                          ("sdk", r'^infersight_ingest_events_total\{outcome="accepted"\} (\S+)$')):  # fmt: skip
        match = re.search(pattern, text, re.M)
        out[name] = float(match.group(1)) if match else 0.0
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512, help="spans per export / events per SDK batch")
    parser.add_argument(
        "--raw", action="store_true", help="also post pre-encoded exports (the endpoint's capacity)"
    )
    parser.add_argument("--no-drift", action="store_true", help="drift off: the ingest path's own CPU")
    args = parser.parse_args()
    kinds = ["otlp", "sdk", *(["otlp-raw"] if args.raw else [])]
    targets = {"otlp": _otlp_sender, "sdk": _sdk_sender, "otlp-raw": _otlp_raw_sender}
    print(f"CPU: {_cpu_model()}, {os.cpu_count()} logical cores; load average {os.getloadavg()}")
    tmp = Path(tempfile.mkdtemp(prefix="infersight-otlp-bench-"))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INFERSIGHT_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "infersight.monitor.cli", "serve", "--port", str(port),
               "--data-dir", str(tmp / "data"), "--log-level", "warning"]  # fmt: skip
    if args.no_drift:
        (tmp / "infersight.yaml").write_text("drift: {enabled: false}\n", encoding="utf-8")
        command += ["--config", str(tmp / "infersight.yaml")]
    server = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the service did not start")
            time.sleep(0.2)
        proc = psutil.Process(server.pid)
        totals = {kind: [0.0, 0.0, 0.0] for kind in kinds}  # items, service CPU s, wall s
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                target = targets[kind]
                before, cpu0, t0 = _accepted(base), sum(proc.cpu_times()[:2]), time.monotonic()
                senders = [mp.Process(target=target, args=(base, args.batch, args.phase_s, 1000 * r + i))
                           for i in range(args.senders)]  # fmt: skip
                for p in senders:
                    p.start()
                for p in senders:
                    p.join()
                after, cpu1, t1 = _accepted(base), sum(proc.cpu_times()[:2]), time.monotonic()
                n = after[kind.partition("-")[0]] - before[kind.partition("-")[0]]
                print(f"round {r + 1} {kind:8}: {n:9,.0f} accepted in {t1 - t0:5.1f} s = {n / (t1 - t0):8,.0f}/s, "
                      f"service CPU {1e3 * (cpu1 - cpu0) / max(n, 1):.3f} s per 1,000", flush=True)  # fmt: skip
                for i, v in enumerate((n, cpu1 - cpu0, t1 - t0)):
                    totals[kind][i] += v
        rates = {k: v[0] / v[2] for k, v in totals.items()}
        cpu = {k: 1e3 * v[1] / max(v[0], 1) for k, v in totals.items()}
        for kind in kinds:
            print(f"{kind:8} total: {totals[kind][0]:,.0f} in {totals[kind][2]:.1f} s = {rates[kind]:,.0f}/s; "
                  f"service CPU {cpu[kind]:.3f} s per 1,000")  # fmt: skip
        for kind in (k for k in kinds if k != "sdk"):
            print(
                f"ratio {kind}/sdk: rate {rates[kind] / rates['sdk']:.2f}, CPU per item {cpu[kind] / cpu['sdk']:.2f}"
            )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
