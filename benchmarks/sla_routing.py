"""SLA routing (fast: the small demo model, int8; standard: the demo model, fp32 or int8) against
a single fp32 path and a single int8 path of the demo model, at the same open-loop rates, in one run.

    .venv/bin/python benchmarks/sla_routing.py [--rates 5,10,15,20,30] [--seconds 8] [--rounds 3] [--threads N]

Load: Poisson arrivals (exponential gaps drawn in advance, submitted at their times whatever
the server does: open loop) of a fixed mix: `--long-share` (20%) long prompts of 8 Banking77
test questions joined (about 100-130 tokens, 32 output tokens), the rest one short Banking77
question (8 output tokens). Greedy decoding. A request's SLA is its class's: short ones the
fast SLA (50 ms), long ones the standard SLA (200 ms), on every side, so "within SLA" means
the same on every side. Latency is from the scheduled arrival to the last token (a late
submit counts against the server). The sides are runtimes on the same registry, run one at a
time, alternated in rounds at each rate: two dual sides (the small demo model, `SMALL_DEMO`
in engine/demo.py, int8, as the fast path; the demo model fp32 or int8 as the standard path),
single fp32 and single int8 of the demo model. A request the length
breaker sheds (503) counts as a miss; the dual side's fast breaker sends requests to the
standard path instead of shedding them (`breaker_action: standard`).

Reported per side and rate: share within its SLA, share within 100 ms, p50/p99 of short and
long requests and of each path's requests (dual sides), how many spilled over or were shed,
and for the dual sides the batch caps (fast/standard) sampled every 50 ms during the load;
at the end, the rates where single fp32 misses its SLA for more than 5% of requests and
whether each dual side beats both single sides there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from infersight.engine import PathSpec, Registry, RoutingSpec, Runtime
from infersight.engine.errors import PathOverloaded
from infersight.engine.paths import cpu_model
from infersight.monitor.data import banking77

FP32 = "mixtral_banking_fp32-v1.0"
INT8 = "mixtral_banking_int8-v1.0"
SMALL = "mixtralsmall_banking_int8-v1.0"  # the small demo model (SMALL_DEMO), int8: the fast path
SHORT_NEW, LONG_NEW = 8, 32
FAST_SLA_MS, STANDARD_SLA_MS = 50.0, 200.0


@dataclass(frozen=True)
class Outcome:
    long: bool
    latency_s: float | None  # None: shed (503)
    path: str | None
    reason: str | None


def _registry(root: Path) -> Path:
    """The demo registry with the small demo model's int8 build (`models init-demo --small`)."""
    from infersight.monitor.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["models", "init-demo", str(root / "registry"), "--small", "--no-corrupted"]) == 0
    return root / "registry"


def _runtime(registry: Path, version: str, standard: str | None) -> Runtime:
    """A runtime serving `version`; routed (SMALL fast, `standard` standard) unless None."""
    rt = Runtime(Registry(registry), max_batch_size=16, max_prompt_tokens=512, max_seq_len=512)
    rt.start(version)
    if standard is not None:
        rt.routing.start(
            RoutingSpec(
                fast=PathSpec(SMALL, FAST_SLA_MS, max_prompt_tokens=48, max_new_tokens=SHORT_NEW * 2),
                standard=PathSpec(standard, STANDARD_SLA_MS),
                breaker_action="standard",  # a short request the fast breaker turns away is served standard
            )
        )
    return rt


def _workload(tokenizer: object, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    texts = [u.text for u in banking77("test")]
    rng = random.Random(seed)
    encode: Callable[[str], list[int]] = lambda t: tokenizer.encode(t, add_special_tokens=False).ids  # type: ignore[attr-defined]  # noqa: E731
    shorts = [encode(t) for t in texts[:400]]
    longs = [encode(" ".join(rng.sample(texts, 8))) for _ in range(100)]
    return shorts, longs


def run_side(
    rt: Runtime,
    rate: float,
    seconds: float,
    long_share: float,
    prompts: tuple,
    seed: int,  # type: ignore[type-arg]
    caps_seen: Counter[tuple[int, int]] | None = None,
) -> list[Outcome]:
    """Open-loop Poisson arrivals at `rate` for `seconds`; waits for every request. With
    `caps_seen`, counts the routed paths' (fast, standard) batch caps every 50 ms meanwhile."""
    shorts, longs = prompts
    rng = random.Random(seed)
    schedule: list[tuple[float, bool, list[int]]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        is_long = rng.random() < long_share
        schedule.append((t, is_long, rng.choice(longs if is_long else shorts)))
    outcomes: list[Outcome | None] = [None] * len(schedule)
    waiters: list[threading.Thread] = []
    done_sampling = threading.Event()

    def sample_caps() -> None:
        while caps_seen is not None and not done_sampling.wait(0.05):
            caps = rt.routing.caps()
            caps_seen[(caps.get("fast", 0), caps.get("standard", 0))] += 1

    sampler = threading.Thread(target=sample_caps, daemon=True)
    sampler.start()
    start = time.perf_counter()
    for i, (at, is_long, ids) in enumerate(schedule):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            handle = rt.submit(ids, max_new_tokens=LONG_NEW if is_long else SHORT_NEW)
        except PathOverloaded:
            outcomes[i] = Outcome(is_long, None, None, "shed")
            continue

        def wait(i: int = i, handle: object = handle, at: float = at, is_long: bool = is_long) -> None:
            handle.result(120)  # type: ignore[attr-defined]
            done = time.perf_counter()
            outcomes[i] = Outcome(is_long, done - (start + at), handle.path, handle.route_reason)  # type: ignore[attr-defined]

        w = threading.Thread(target=wait, daemon=True)
        w.start()
        waiters.append(w)
    for w in waiters:
        w.join(180)
    done_sampling.set()
    sampler.join()
    return [o for o in outcomes if o is not None]


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarize(outcomes: list[Outcome]) -> dict[str, float | int | None]:
    def sla(o: Outcome) -> float:
        return (STANDARD_SLA_MS if o.long else FAST_SLA_MS) / 1000.0

    n = len(outcomes)
    within = sum(o.latency_s is not None and o.latency_s <= sla(o) for o in outcomes)
    within_100 = sum(o.latency_s is not None and o.latency_s <= 0.1 for o in outcomes)
    short = [o.latency_s for o in outcomes if not o.long and o.latency_s is not None]
    long = [o.latency_s for o in outcomes if o.long and o.latency_s is not None]
    fast = [o.latency_s for o in outcomes if o.path == "fast" and o.latency_s is not None]
    standard = [o.latency_s for o in outcomes if o.path == "standard" and o.latency_s is not None]
    return {
        "n": n,
        "within_sla": within / n if n else None,
        "within_100ms": within_100 / n if n else None,
        "short_p50": _q(short, 0.5), "short_p99": _q(short, 0.99),
        "long_p50": _q(long, 0.5), "long_p99": _q(long, 0.99),
        "fast_p50": _q(fast, 0.5), "fast_p99": _q(fast, 0.99),
        "standard_p50": _q(standard, 0.5), "standard_p99": _q(standard, 0.99),
        "spilled": sum(o.reason == "spill" for o in outcomes),
        "shed": sum(o.reason == "shed" for o in outcomes),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="5,10,15,20,30", help="requests per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=8.0, help="of arrivals per side, rate and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-share", type=float, default=0.2)
    ap.add_argument(
        "--registry", type=Path, default=None, help="default: the demo registry, built in a temp dir"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rates = [float(r) for r in args.rates.split(",")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores, load average {load:.1f} at the start; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    print(f"mix: {1 - args.long_share:.0%} short Banking77 questions ({SHORT_NEW} output tokens, SLA "
          f"{FAST_SLA_MS:.0f} ms), {args.long_share:.0%} long prompts of 8 questions ({LONG_NEW} output tokens, "
          f"SLA {STANDARD_SLA_MS:.0f} ms); Poisson arrivals, {args.seconds:.0f} s per side, rate and round, "
          f"{args.rounds} rounds, sides alternated")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        registry = args.registry or _registry(Path(tmp))
        sides = {
            "dual (small int8 + fp32)": _runtime(registry, FP32, standard=FP32),
            "dual (small int8 + int8)": _runtime(registry, INT8, standard=INT8),
            "single fp32": _runtime(registry, FP32, standard=None),
            "single int8": _runtime(registry, INT8, standard=None),
        }
        first = next(iter(sides.values()))
        prompts = _workload(first.tokenizer, seed=7)
        print(f"prompt tokens: short {min(map(len, prompts[0]))}-{max(map(len, prompts[0]))}, "
              f"long {min(map(len, prompts[1]))}-{max(map(len, prompts[1]))}")  # fmt: skip
        for rt in sides.values():  # warm the step-time measurements (and the allocator) before timing
            run_side(rt, 5.0, 3.0, args.long_share, prompts, seed=1)
        results: dict[tuple[str, float], list[Outcome]] = {}
        caps_seen: dict[tuple[str, float], Counter[tuple[int, int]]] = {}
        summaries: dict[float, dict[str, dict[str, float | int | None]]] = {}
        for rate in rates:
            for r in range(args.rounds):
                order = list(sides.items())
                if r % 2:
                    order.reverse()
                for name, rt in order:
                    seen = caps_seen.setdefault((name, rate), Counter()) if name.startswith("dual") else None
                    outcomes = run_side(
                        rt,
                        rate,
                        args.seconds,
                        args.long_share,
                        prompts,
                        seed=1000 * r + int(rate),
                        caps_seen=seen,
                    )
                    results.setdefault((name, rate), []).extend(outcomes)
            summaries[rate] = {name: summarize(results[(name, rate)]) for name in sides}
            _print_rate(rate, summaries[rate])
            for name in sides:
                if (name, rate) in caps_seen:
                    common = ", ".join(
                        f"{f}/{s} {n}x" for (f, s), n in caps_seen[(name, rate)].most_common(3)
                    )
                    print(f"{name}: batch caps (fast/standard) sampled during the load: {common}")
        _verdict(rates, summaries)
        for name, rt in sides.items():
            if name.startswith("dual"):
                print(f"{name}: batch caps at the end {rt.routing.caps()}; route counts {rt.routing.counts()}; "
                      f"steps the standard replica sat out for the fast path: {rt.routing.held}")  # fmt: skip
                for path, snap in rt.routing.step_times().items():
                    steps = ", ".join(f"{b}: {s * 1000:.1f}" for b, s in sorted(snap.decode_s.items()))
                    prefill = (snap.prefill_s_per_token or 0.0) * 1000
                    print(f"  {path}: decode ms by batch {{{steps}}}, prefill {prefill:.2f} ms/token, "
                          f"output {snap.output_tokens or 0:.1f} tokens")  # fmt: skip
        for rt in sides.values():
            rt.stop(drain=False)
    if hasattr(os, "getloadavg"):
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def _print_rate(rate: float, rows: dict[str, dict[str, float | int | None]]) -> None:
    def ms(v: object) -> str:
        return "—" if v is None else f"{float(v) * 1000:.0f}"  # type: ignore[arg-type]

    def pct(v: object) -> str:
        return "—" if v is None else f"{float(v) * 100:.1f}%"  # type: ignore[arg-type]

    print(
        f"\n| rate {rate:g}/s | n | within SLA | within 100 ms | short p50/p99 ms | long p50/p99 ms "
        "| fast path p50/p99 ms | standard path p50/p99 ms | spilled | shed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, s in rows.items():
        print(f"| {name} | {s['n']} | {pct(s['within_sla'])} | {pct(s['within_100ms'])} | "
              f"{ms(s['short_p50'])}/{ms(s['short_p99'])} | {ms(s['long_p50'])}/{ms(s['long_p99'])} | "
              f"{ms(s['fast_p50'])}/{ms(s['fast_p99'])} | {ms(s['standard_p50'])}/{ms(s['standard_p99'])} | "
              f"{s['spilled']} | {s['shed']} |", flush=True)  # fmt: skip


def _verdict(rates: list[float], rows: dict[float, dict[str, dict[str, float | int | None]]]) -> None:
    """The rates where single fp32 misses its SLA for more than 5% of requests, and whether
    each dual side beats both single sides on the share within SLA there."""
    missing = [r for r in rates if (rows[r]["single fp32"]["within_sla"] or 0.0) < 0.95]
    print(f"\nsingle fp32 misses its SLA for more than 5% of requests at: "
          f"{', '.join(f'{r:g}/s' for r in missing) or 'none of the rates run'}")  # fmt: skip
    for rate in missing:
        singles = max(rows[rate][n]["within_sla"] or 0.0 for n in ("single fp32", "single int8"))
        for name, s in rows[rate].items():
            if name.startswith("dual"):
                share = s["within_sla"] or 0.0
                verdict = "beats" if share > singles else "does not beat"
                print(
                    f"  {rate:g}/s: {name} {share:.1%} within SLA {verdict} the best single side ({singles:.1%})"
                )


if __name__ == "__main__":
    main()
