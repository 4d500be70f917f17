"""The @track decorator's added cost per call, against a bare prometheus_client pair, for
sync functions, coroutines, generators and async generators (streams).

    .venv/bin/python benchmarks/sdk_overhead.py [--calls 20000] [--rounds 15] [--items 8] [--layer]

The baseline is what a user would write by hand with prometheus_client:

    start = perf_counter(); result = fn(x); hist.observe(perf_counter() - start); counter.inc()

for a coroutine the same around `await fn(x)`; for a generator `yield from fn(x)` between
the clock reads; for an async generator `async for item in fn(x): yield item`: the least
a hand-written wrapper of that kind of function needs. Each function does nothing (returns
its argument, or yields `--items` items), so the cost measured is the wrapper's.
Coroutines and async generators are driven without an event loop (`send(None)`), the
same driver for the three sides.

Added cost = (cost per instrumented call) - (cost per bare call), for the baseline and
for `@monitor.track(...)`, measured in the same process, in alternating rounds; the
figures quoted are ratios of medians. Two costs, both CPU time, so a shared, loaded
machine's descheduling does not count:
- caller: the calling thread's CPU time (`time.thread_time`): what the decorator adds
  to the user's call. This is the figure the targets apply to.
- total: the process's CPU time (all threads) with each tracked round ending in
  `monitor.flush()`: adds the delivery thread's work (request ids, InferenceRecord
  objects, redaction and truncation, the sink) for the sampled records.
Folding the buffered observations into histograms and sketches happens in the caller
when a buffer fills, so its amortized cost is in both. `--layer` adds a fourth side: the
manual wrapper with nothing in it (no clock, no metric), the caller's cost of being a
wrapper of that kind at all, which neither the baseline nor the decorator can avoid. Scenarios: payload sampling at 0%
(the target: at most half of the baseline) and 100% (in-process sink), for each
kind; and, for sync calls, both again with a stalled sink (blocks until the run ends, so
the queue fills and drops, counted).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from infersight.monitor.sdk import Monitor
from prometheus_client import CollectorRegistry, Counter, Histogram


def noop(prompt: str) -> str:
    return prompt


async def noop_async(prompt: str) -> str:
    return prompt


def _generators(
    items: int,
) -> tuple[
    Callable[[str], Iterator[int]], Callable[[str], Iterator[int]], Callable[[str], AsyncIterator[int]]
]:
    def noop_gen(prompt: str) -> Iterator[int]:
        for i in range(items):  # noqa: UP028 (a token stream's shape; `delegating` is the other)
            yield i

    def noop_delegating(prompt: str) -> Iterator[int]:
        yield from range(items)

    async def noop_stream(prompt: str) -> AsyncIterator[int]:
        for i in range(items):
            yield i

    return noop_gen, noop_delegating, noop_stream


Driver = Callable[[Callable[[str], Any], int], None]


def _drive_sync(fn: Callable[[str], Any], calls: int) -> None:
    for _ in range(calls):
        fn("hello")


def _drive_async(fn: Callable[[str], Any], calls: int) -> None:
    for _ in range(calls):
        try:  # noqa: SIM105 (contextlib.suppress would cost more than what is measured)
            fn("hello").send(None)
        except StopIteration:
            pass


def _drive_gen(fn: Callable[[str], Any], calls: int) -> None:
    for _ in range(calls):
        for _item in fn("hello"):
            pass


async def _consume(agen: AsyncIterator[Any]) -> None:
    async for _item in agen:
        pass


def _drive_stream(fn: Callable[[str], Any], calls: int) -> None:
    for _ in range(calls):
        try:  # noqa: SIM105
            _consume(fn("hello")).send(None)
        except StopIteration:
            pass


def _kinds(
    items: int, hist: Histogram, counter: Counter
) -> dict[str, tuple[Callable[[str], Any], Callable[[str], Any], Callable[[str], Any], Driver]]:
    """kind -> (bare function, the hand-written prometheus wrapper of it, the same wrapper
    with nothing in it (the cost of being a wrapper of that kind), its driver)."""
    noop_gen, noop_delegating, noop_stream = _generators(items)
    pc = time.perf_counter

    def layer(prompt: str) -> str:
        return noop(prompt)

    async def layer_async(prompt: str) -> str:
        return await noop_async(prompt)

    def layer_gen(prompt: str) -> Iterator[int]:
        yield from noop_gen(prompt)

    def layer_delegating(prompt: str) -> Iterator[int]:
        yield from noop_delegating(prompt)

    async def layer_stream(prompt: str) -> AsyncIterator[int]:
        async for item in noop_stream(prompt):
            yield item

    def manual(prompt: str) -> str:
        start = pc()
        result = noop(prompt)
        hist.observe(pc() - start)
        counter.inc()
        return result

    async def manual_async(prompt: str) -> str:
        start = pc()
        result = await noop_async(prompt)
        hist.observe(pc() - start)
        counter.inc()
        return result

    def manual_gen(prompt: str) -> Iterator[int]:
        start = pc()
        yield from noop_gen(prompt)
        hist.observe(pc() - start)
        counter.inc()

    def manual_delegating(prompt: str) -> Iterator[int]:
        start = pc()
        yield from noop_delegating(prompt)
        hist.observe(pc() - start)
        counter.inc()

    async def manual_stream(prompt: str) -> AsyncIterator[int]:
        start = pc()
        async for item in noop_stream(prompt):
            yield item
        hist.observe(pc() - start)
        counter.inc()

    return {
        "sync": (noop, manual, layer, _drive_sync),
        "async": (noop_async, manual_async, layer_async, _drive_async),
        "generator": (noop_gen, manual_gen, layer_gen, _drive_gen),
        "delegating": (noop_delegating, manual_delegating, layer_delegating, _drive_gen),
        "stream": (noop_stream, manual_stream, layer_stream, _drive_stream),
    }


def _per_call(
    drive: Driver,
    fn: Callable[[str], Any],
    calls: int,
    after: Callable[[], object] | None,
) -> tuple[float, float]:
    """(caller CPU per call, process CPU per call including `after()`)."""
    p0, t0 = time.process_time(), time.thread_time()
    drive(fn, calls)
    t1 = time.thread_time()
    if after is not None:
        after()
    return (t1 - t0) / calls, (time.process_time() - p0) / calls


def _scenario(
    monitor: Monitor, kind: str, items: int, calls: int, rounds: int, *, stalled: bool, layer: bool
) -> dict[str, float]:
    registry = CollectorRegistry()
    hist = Histogram("bench_seconds", "baseline", registry=registry)
    counter = Counter("bench_calls", "baseline", registry=registry)
    bare, manual, empty, drive = _kinds(items, hist, counter)[kind]
    tracked = monitor.track(model="bench", model_version=kind)(bare)
    sides = {"bare": bare, "manual": manual, "tracked": tracked}
    if layer:
        sides["layer"] = empty
    caller: dict[str, list[float]] = {k: [] for k in sides}
    total: dict[str, list[float]] = {k: [] for k in sides}
    flush = None if stalled else (lambda: monitor.flush(30.0))
    for fn in sides.values():  # warm up (and fill the first buffers)
        _per_call(drive, fn, calls // 10, None)
    gc.collect()
    for r in range(rounds):
        order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
        for key, fn in order:
            c, t = _per_call(drive, fn, calls, flush if key == "tracked" else None)
            caller[key].append(c)
            total[key].append(t)
    out = {}
    for name, series in (("caller", caller), ("total", total)):
        med = {k: statistics.median(v) for k, v in series.items()}
        out[f"{name}_manual_ns"] = (med["manual"] - med["bare"]) * 1e9
        out[f"{name}_tracked_ns"] = (med["tracked"] - med["bare"]) * 1e9
        out[f"{name}_ratio"] = (med["tracked"] - med["bare"]) / (med["manual"] - med["bare"])
        if layer:
            out[f"{name}_layer_ns"] = (med["layer"] - med["bare"]) * 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--items", type=int, default=8, help="items per generator or stream call")
    parser.add_argument("--kinds", default="sync,async,generator,stream")
    parser.add_argument(
        "--layer",
        action="store_true",
        help="also time the manual wrapper with nothing in it (the cost of being a wrapper of that kind)",
    )
    args = parser.parse_args()
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)

    release = threading.Event()

    def stalled(records: Any) -> None:
        release.wait()

    delivered = []

    def fast(records: Any) -> None:
        delivered.append(len(records))

    scenarios = []
    for kind in args.kinds.split(","):
        scenarios.append((f"{kind}, sampling 0%", kind, Monitor(sink=fast, sample_rate=0.0), False))
        scenarios.append((f"{kind}, sampling 100%", kind, Monitor(sink=fast, sample_rate=1.0), False))
    if "sync" in args.kinds.split(","):
        scenarios.append(
            ("sync, sampling 0%, stalled sink", "sync", Monitor(sink=stalled, sample_rate=0.0), True)
        )
        scenarios.append(
            ("sync, sampling 100%, stalled", "sync", Monitor(sink=stalled, sample_rate=1.0), True)
        )
    print(
        f"python {platform.python_version()} on {platform.machine()}, {args.calls} calls x {args.rounds} rounds,"
        f" {args.items} items per generator or stream call"
    )
    print("added CPU ns per call (median of rounds): caller thread | whole process incl. delivery")
    print(
        f"{'scenario':30} {'manual':>7} {'track':>7} {'ratio':>6} | {'manual':>7} {'track':>7} {'ratio':>6}"
        + (f" | {'layer':>6}" if args.layer else "")
    )
    for name, kind, monitor, is_stalled in scenarios:
        r = _scenario(
            monitor, kind, args.items, args.calls, args.rounds, stalled=is_stalled, layer=args.layer
        )
        print(
            f"{name:30} {r['caller_manual_ns']:7.0f} {r['caller_tracked_ns']:7.0f} {r['caller_ratio']:6.2f} | "
            f"{r['total_manual_ns']:7.0f} {r['total_tracked_ns']:7.0f} {r['total_ratio']:6.2f}"
            + (f" | {r['caller_layer_ns']:6.0f}" if args.layer else "")
        )
    if scenarios[-1][3]:
        print(
            "stalled sink: queue_full drops counted =",
            scenarios[-1][2].counters.value("dropped", "queue_full"),
            "| fast sink: records delivered =",
            sum(delivered),
        )
    release.set()
    for _, _, monitor, _ in scenarios:
        monitor.close(timeout=2.0)


if __name__ == "__main__":
    main()
