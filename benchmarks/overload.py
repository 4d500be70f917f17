"""`infersight serve` under overload: a flood of long prompts, then a 7 MB prompt.

    .venv/bin/python benchmarks/overload.py [--seconds 40] [--threads 16] [--rate 4]
    .venv/bin/python benchmarks/overload.py --seconds 15 --client-rates 20,0 --rounds 2 --no-big-prompt

`infersight serve` in a process of its own on loopback (the clients here), the demo registry with the small demo model, and the README's `routing:`
block (fast: the small model int8, 50 ms SLA, prompts up to 48 tokens and 16 new tokens;
standard: the demo model fp32, 200 ms SLA; breaker_action reject).

1. Flood: `--threads` clients send long prompts (8 Banking77 questions joined, 32 new tokens)
   back to back for `--seconds` (after a 503 or 429 again 10 ms later: a client that ignores
   Retry-After), while short questions (one Banking77 question of at most 20 words, 8 new tokens)
   arrive at `--rate` per second (open loop: each at its time, whatever the server does).
   Reported: the share of short questions answered 200, their p50/p95 from arrival to answer
   and the p95 over the fast path's SLA (the issue's target: at least 95% answered, p95 within
   four times the SLA), and what the long ones got (200, 503 shed, 429 overloaded).
2. A 7 MB prompt (no token), sent 3 times in a row, while /healthz is asked every 50 ms:
   the big prompts' answers, and /healthz's worst and p95 latency meanwhile.

The flood comes from one client address (`--flood-address`, 127.0.0.2 by default: loopback
answers all of 127/8) and the short questions from another (127.0.0.1), neither with the token:
the flood is one client, the short questions another. `--client-rates 20,0`: the service's
`limits.client_rate` (requests per second per client address; 0: no limit), one server per
value, alternated over `--rounds` (20, 0, 0, 20, ...), the flood's answers split into 429s of
the rate limit and 429s of admission control (the engine's queue full).

`--honour-retry-after`: the flood's clients wait the Retry-After of a 503 or 429 (by default
they ask again 10 ms later). Prints the CPU model; run it with both sides' code (this
checkout's and main's interpreter) to compare. The machine's other load changes every absolute figure: quote ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import random
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

FP32 = "mixtral_banking_fp32-v1.0"
SMALL = "mixtralsmall_banking_int8-v1.0"
FAST_SLA_MS = 50.0


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@contextlib.contextmanager
def _serve(root: Path, client_rate: float | None = None) -> Any:
    """`infersight serve` in its own process (the clients' threads here must not share its GIL)."""
    import os
    import subprocess
    import sys

    from infersight.monitor.cli import main as cli

    with contextlib.redirect_stdout(io.StringIO()):
        assert cli(["models", "init-demo", str(root / "registry"), "--small", "--no-corrupted"]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "infersight.yaml").write_text(
        f"""
engine: {{registry: {root / "registry"}, version: {FP32}}}
routing:
  fast: {{version: {SMALL}, sla_ms: {FAST_SLA_MS:g}, max_prompt_tokens: 48, max_new_tokens: 16}}
  standard: {{version: {FP32}, sla_ms: 200}}
drift: {{enabled: false}}
"""
        + ("" if client_rate is None else f"limits: {{client_rate: {client_rate:g}}}\n")
    )
    env = {**os.environ, "INFERSIGHT_TOKEN": "bench-token-0123456789"}
    server = subprocess.Popen(
        [sys.executable, "-m", "infersight.monitor.cli", "serve", "--config", str(root / "infersight.yaml"),
         "--port", str(port), "--data-dir", str(root / "data"), "--log-level", "error"],
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None and time.monotonic() < deadline, "the service did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(60)


def flood(
    url: str,
    seconds: float,
    threads: int,
    rate: float,
    honour_retry_after: bool = False,
    flood_address: str = "",
) -> tuple[int, int, float | None]:
    """Runs the flood; returns (short questions answered 200, sent, their p95 in seconds)."""
    from infersight.monitor.data import banking77

    texts = [u.text for u in banking77("test")]
    rng = random.Random(0)
    longs = [" ".join(rng.sample(texts, 8)) for _ in range(50)]
    questions = [t for t in texts if len(t.split()) <= 20]  # short: well within the fast path's 48 tokens
    stop = threading.Event()
    long_status: list[int] = []
    client = httpx.Client(timeout=300.0, limits=httpx.Limits(max_connections=48))
    flooder = httpx.Client(timeout=300.0, limits=httpx.Limits(max_connections=48),
                           transport=httpx.HTTPTransport(local_address=flood_address or None))  # fmt: skip

    def long_sender(i: int) -> None:
        j = i
        while not stop.is_set():
            r = flooder.post(
                f"{url}/v1/completions", json={"prompt": longs[j % len(longs)], "max_tokens": 32}
            )
            long_status.append(
                -429 if r.status_code == 429 and b"rate_limited" in r.content[:40] else r.status_code
            )
            j += threads
            if (
                r.status_code != 200
            ):  # shed or refused: again after Retry-After, or 10 ms (a client ignoring it)
                wait = float(r.headers.get("retry-after", 0)) if honour_retry_after else 0.0
                stop.wait(max(0.01, wait))

    def short(question: str, due: float) -> tuple[int, float]:
        r = client.post(f"{url}/v1/completions", json={"prompt": question, "max_tokens": 8})
        if r.status_code != 200:
            print(f"  a short question got {r.status_code}: {r.json()['error']['message']} ({question!r})")
        return r.status_code, time.perf_counter() - due

    senders = [threading.Thread(target=long_sender, args=(i,), daemon=True) for i in range(threads)]
    for t in senders:
        t.start()
    time.sleep(2.0)  # the flood under way
    shorts = []
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        n = int(seconds * rate)
        for k in range(n):
            due = start + k / rate
            time.sleep(max(0.0, due - time.perf_counter()))
            shorts.append(pool.submit(short, questions[(7 * k) % len(questions)], due))
        results = [f.result() for f in shorts]
    stop.set()
    for t in senders:
        t.join(300)
    client.close()
    flooder.close()
    ok = [s for status, s in results if status == 200]
    p95 = _q(ok, 0.95)
    print(f"flood: {threads} threads of long prompts for {seconds:.0f} s, short questions at {rate:g}/s"
          + (", the flood honouring Retry-After" if honour_retry_after else ""))  # fmt: skip
    print(f"  short: {len(ok)}/{len(results)} answered 200 ({100.0 * len(ok) / max(1, len(results)):.1f}%), "
          f"others {sorted({st for st, _ in results if st != 200})}")  # fmt: skip
    if p95 is not None:
        p50 = _q(ok, 0.5) or 0.0
        print(
            f"  short p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms = {p95 * 1000 / FAST_SLA_MS:.1f}x the fast SLA"
        )
    names = {-429: "429 rate-limited", 429: "429 admission"}
    print(f"  long: {len(long_status)} sent: " + ", ".join(
        f"{long_status.count(c)} x {names.get(c, c)}" for c in sorted(set(long_status))))  # fmt: skip
    return len(ok), len(results), p95


def big_prompt(url: str) -> None:
    huge = "hello world " * (7 * 1024 * 1024 // 12)
    stop = threading.Event()
    health: list[float] = []

    def poll() -> None:
        with httpx.Client(timeout=120.0) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                c.get(f"{url}/healthz")
                health.append(time.perf_counter() - t0)
                time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    answers = []
    with httpx.Client(timeout=300.0) as c:
        for _ in range(3):
            t0 = time.perf_counter()
            r = c.post(f"{url}/v1/completions", json={"prompt": huge, "max_tokens": 4})
            answers.append((r.status_code, time.perf_counter() - t0))
    stop.set()
    poller.join(120)
    print("7 MB prompt x3 (no token): " + ", ".join(f"{st} in {s:.2f} s" for st, s in answers))
    print(f"  /healthz meanwhile: {len(health)} answers, p95 {(_q(health, 0.95) or 0) * 1000:.0f} ms, "
          f"worst {max(health, default=0) * 1000:.0f} ms")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--honour-retry-after", action="store_true", help="the flood's clients wait Retry-After")
    ap.add_argument(
        "--flood-address", default="127.0.0.2", help="the flood's client address ('': the default)"
    )
    ap.add_argument("--client-rates", default="", help="limits.client_rate values to alternate, e.g. 20,0")
    ap.add_argument("--rounds", type=int, default=1, help="with --client-rates: rounds of every value")
    ap.add_argument("--no-big-prompt", action="store_true")
    args = ap.parse_args()
    import infersight.engine

    print(f"CPU: {_cpu()}; infersight from {Path(str(infersight.engine.__file__)).parent.parent}")
    values: list[float | None] = (
        [float(v) for v in args.client_rates.split(",")] if args.client_rates else [None]
    )
    order = [v for r in range(args.rounds) for v in (values if r % 2 == 0 else values[::-1])]
    summary: list[str] = []
    for value in order:
        if value is not None:
            print(f"-- limits.client_rate: {value:g}" + (" (no limit)" if value == 0 else ""))
        with tempfile.TemporaryDirectory() as tmp, _serve(Path(tmp), value) as url:
            ok, sent, p95 = flood(url, args.seconds, args.threads, args.rate, args.honour_retry_after,
                                  args.flood_address)  # fmt: skip
            if not args.no_big_prompt:
                big_prompt(url)
        ratio = "-" if p95 is None else f"{p95 * 1000 / FAST_SLA_MS:.1f}x"
        summary.append(f"client_rate={'default' if value is None else f'{value:g}'}: {ok}/{sent} short 200, "
                       f"p95/SLA {ratio}")  # fmt: skip
    if len(summary) > 1:
        print("summary (in run order): " + "; ".join(summary))


if __name__ == "__main__":
    main()
