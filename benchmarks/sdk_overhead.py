"""The @track decorator's added time per call, for sync functions, coroutines, generators and
async generators: in nanoseconds on a call that does nothing, and as a share of a 1 ms call.

    .venv/bin/python benchmarks/sdk_overhead.py [--calls 20000] [--slow-calls 300] [--rounds 15]
        [--items 8] [--kinds sync,async,generator,delegating,async-generator] [--rates 0,1]

The target (payload sampling at 0%): at most one microsecond added per call, and at most 1% of a 1 ms call,
for each kind. Two measurements, each the median of `--rounds` rounds in which the bare function
and its `@monitor.track(...)` twin alternate (bare first in even rounds, tracked first in odd):

- added ns per call: the functions do nothing (return their argument, or yield `--items`
  items), so what is left is the wrapper's; `empty` is what a Python wrapper of the same kind
  with nothing in it adds (forwarding `*args, **kwargs`, one `for`/`async for` per item), a
  floor no Python decorator of that kind gets under. Timed as the calling thread's CPU time
  (`time.thread_time`), so a shared machine's descheduling does not count. At 100% sampling the
  delivery thread's work (request ids, records, the sink) is not in this figure: it runs off
  the caller's thread.
- share of a 1 ms call: the same kinds, each spending 1 ms in a busy-wait on `perf_counter`
  (a generator spreads it over its items), each call timed on the wall clock, a round's figure
  the median of its calls that ran undisturbed. A spin ends at its deadline whatever the
  wrapper did before it, so what the wrapper adds shows as wall time past the 1 ms (a sleep
  would add the scheduler's wake-up jitter to both sides); a call during which the thread
  waited for a core (its CPU time short of its wall time) is left out, as its deadline passed
  while it waited. The number of calls kept is printed.

Coroutines and async generators are driven without an event loop (`send(None)`), the same
driver for both sides. The added ns include the fold of the buffered observations into
histograms and sketches, which happens in the caller once a buffer fills (amortized).
`generator` is a `for ... yield` token stream (the pass-through loop); `delegating` a
`yield from` one (the loop that checks what is sent).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from infersight.monitor.sdk import Monitor

Driver = Callable[[Callable[[str], Any], int], None]
KINDS = ("sync", "async", "generator", "delegating", "async-generator")
TARGET_NS = 1000.0
TARGET_SHARE = 0.01
_DESCHEDULED_S = 20e-6  # wall time past the thread's CPU time: the call waited for a core


def _spin(seconds: float) -> None:
    if seconds <= 0.0:
        return
    pc = time.perf_counter
    deadline = pc() + seconds
    while pc() < deadline:
        pass


def _functions(items: int, seconds: float) -> dict[str, Callable[[str], Any]]:
    """One function of each kind, spending `seconds` in all (generators: spread over items)."""
    per_item = seconds / items

    def sync(prompt: str) -> str:
        _spin(seconds)
        return prompt

    async def coroutine(prompt: str) -> str:
        _spin(seconds)
        return prompt

    def generator(prompt: str) -> Iterator[int]:
        for i in range(items):  # a token stream's shape; `delegating` is the other
            _spin(per_item)
            yield i

    def delegating(prompt: str) -> Iterator[int]:
        _spin(seconds)
        yield from range(items)

    async def async_generator(prompt: str) -> AsyncIterator[int]:
        for i in range(items):
            _spin(per_item)
            yield i

    return {
        "sync": sync,
        "async": coroutine,
        "generator": generator,
        "delegating": delegating,
        "async-generator": async_generator,
    }


def _empty_wrapper(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapper of `fn`'s kind with nothing in it, forwarding `*args, **kwargs` as @track's do:
    what being a Python wrapper of that kind costs before it tracks anything."""

    def plain(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if kwargs else fn(*args)

    async def coroutine(*args: Any, **kwargs: Any) -> Any:
        return await (fn(*args, **kwargs) if kwargs else fn(*args))

    def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for value in fn(*args, **kwargs) if kwargs else fn(*args):  # noqa: UP028 (@track's loop)
            yield value

    async def async_generator(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            yield value

    if kind in ("sync", "async"):
        return plain if kind == "sync" else coroutine
    return async_generator if kind == "async-generator" else generator


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


def _drive_agen(fn: Callable[[str], Any], calls: int) -> None:
    for _ in range(calls):
        try:  # noqa: SIM105
            _consume(fn("hello")).send(None)
        except StopIteration:
            pass


DRIVERS: dict[str, Driver] = {
    "sync": _drive_sync,
    "async": _drive_async,
    "generator": _drive_gen,
    "delegating": _drive_gen,
    "async-generator": _drive_agen,
}


def _alternated(
    drive: Driver, sides: dict[str, Callable[[str], Any]], calls: int, rounds: int, *, each: bool
) -> dict[str, float]:
    """Median seconds per call of each side, the medians of the rounds' figures. `each=False`: a round's figure is its CPU time (the calling thread's) over
    its calls; `each=True`: the median of its calls' wall times, one by one, of the calls that
    ran undisturbed (their thread's CPU time within `_DESCHEDULED_S` of their wall time): a
    call the scheduler interrupted ends past its deadline by however long it waited."""
    for fn in sides.values():  # warm up (and fill the first buffers)
        drive(fn, max(1, calls // 10))
    gc.collect()
    per_call: dict[str, list[float]] = {k: [] for k in sides}
    kept = dict.fromkeys(sides, 0)
    pc, cpu = time.perf_counter, time.thread_time
    for r in range(rounds):
        order = list(sides.items()) if r % 2 == 0 else list(reversed(sides.items()))
        for key, fn in order:
            if each:
                walls = []
                for _ in range(calls):
                    c0 = cpu()
                    t0 = pc()
                    drive(fn, 1)
                    wall = pc() - t0
                    if wall - (cpu() - c0) < _DESCHEDULED_S:  # it ran the whole time
                        walls.append(wall)
                kept[key] += len(walls)
                if walls:
                    per_call[key].append(statistics.median(walls))
            else:
                t0 = cpu()
                drive(fn, calls)
                per_call[key].append((cpu() - t0) / calls)
    if each:
        print(
            f"  ({kept['bare']} and {kept['tracked']} of {calls * rounds} 1 ms calls ran undisturbed)",
            flush=True,
        )
    return {key: statistics.median(values) for key, values in per_call.items()}


@dataclass(frozen=True)
class Row:
    kind: str
    rate: float
    bare_ns: float
    added_ns: float
    empty_ns: float  # of which an empty wrapper of the kind
    slow_bare_us: float
    slow_added_us: float

    @property
    def share(self) -> float:
        return self.slow_added_us / self.slow_bare_us

    @property
    def meets_target(self) -> bool:
        return self.added_ns <= TARGET_NS and self.share <= TARGET_SHARE


def measure(kind: str, rate: float, *, items: int, calls: int, slow_calls: int, rounds: int) -> Row:
    delivered: list[int] = []
    monitor = Monitor(sink=lambda records: delivered.append(len(records)), sample_rate=rate)
    try:
        drive = DRIVERS[kind]
        fast = _functions(items, 0.0)[kind]
        slow = _functions(items, 1e-3)[kind]
        fast_tracked = monitor.track(model="bench", model_version=f"{kind}-fast")(fast)
        slow_tracked = monitor.track(model="bench", model_version=f"{kind}-1ms")(slow)
        empty = _empty_wrapper(kind, fast)
        f = _alternated(
            drive, {"bare": fast, "tracked": fast_tracked, "empty": empty}, calls, rounds, each=False
        )
        s = _alternated(drive, {"bare": slow, "tracked": slow_tracked}, slow_calls, rounds, each=True)
    finally:
        monitor.close(timeout=5.0)
    return Row(
        kind, rate, f["bare"] * 1e9, (f["tracked"] - f["bare"]) * 1e9, (f["empty"] - f["bare"]) * 1e9,
        s["bare"] * 1e6, (s["tracked"] - s["bare"]) * 1e6,
    )  # fmt: skip


def _ladder(fn: Callable[..., Any], monitor: Monitor) -> dict[str, Callable[..., Any]]:
    """Async-generator wrappers of `fn`, each doing what the one before it does and one thing
    more, up to the least a Python wrapper must do to record a stream as @track does: an
    empty wrapper; `start`: the start's clock read and in-flight count; `items`: an item count
    and the first item's clock read; `end`: the end's clock read and one `extend` of the
    stream buffer (emptied once it fills); `fold`: the buffer folded instead (into histograms
    and sketches), as @track's is. Each step has its own label set."""
    clock = monitor.clock

    async def empty(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            yield value

    entered_start = monitor.stats.series("bench", "ladder-start").entered.incr

    async def start(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        _begin = clock()
        entered_start()
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            yield value

    entered_items = monitor.stats.series("bench", "ladder-items").entered.incr

    async def items(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        _begin = clock()
        entered_items()
        n = 0
        _first = 0.0
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            if not n:
                _first = clock()
            n += 1
            yield value

    ended = monitor.stats.series("bench", "ladder-end")
    entered_end, buffer, mask = ended.entered.incr, ended.streamed, ended.fold_mask
    streamed_end = buffer.extend

    async def end(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        begin = clock()
        k = entered_end()
        n = 0
        first = 0.0
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            if not n:
                first = clock()
            n += 1
            yield value
        streamed_end((begin, first, clock(), n))
        if k & mask == mask:
            del buffer[:]  # dropped where `fold` folds it

    series = monitor.stats.series("bench", "ladder-fold")
    entered, streamed = series.entered.incr, series.streamed.extend

    async def fold(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        begin = clock()
        k = entered()
        n = 0
        first = 0.0
        async for value in fn(*args, **kwargs) if kwargs else fn(*args):
            if not n:
                first = clock()
            n += 1
            yield value
        streamed((begin, first, clock(), n))
        if k & mask == mask:
            series.fold()

    return {"empty": empty, "+start": start, "+items": items, "+end": end, "+fold": fold}


def ladder(*, items: int, calls: int, rounds: int) -> None:
    """`--ladder`: the added ns of each step of `_ladder`, then of @track, on an async
    generator of `items` items, alternated in the same rounds as `measure`'s."""
    monitor = Monitor(sample_rate=0.0)
    try:
        fast = _functions(items, 0.0)["async-generator"]
        sides = {"bare": fast, **_ladder(fast, monitor)}
        sides["@track"] = monitor.track(model="bench", model_version="ladder-track")(fast)
        f = _alternated(_drive_agen, sides, calls, rounds, each=False)
    finally:
        monitor.close(timeout=5.0)
    print(f"async generator, {items} items a call, 0% sampling: bare call {f['bare'] * 1e9:.0f} ns")
    print(f"{'step':10} {'added ns':>8} {'step ns':>8}")
    previous = f["bare"]
    for key, seconds in f.items():
        if key != "bare":
            print(f"{key:10} {(seconds - f['bare']) * 1e9:8.0f} {(seconds - previous) * 1e9:+8.0f}")
            previous = seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round, no-op functions")
    parser.add_argument("--slow-calls", type=int, default=300, help="calls per round, 1 ms functions")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--items", type=int, default=8, help="items per generator call")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--rates", default="0,1", help="payload sampling rates (the target is at 0)")
    parser.add_argument(
        "--ladder",
        action="store_true",
        help="instead: where an async generator's added time goes, step by step (see _ladder)",
    )
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; valid: {', '.join(KINDS)}")
    from infersight.engine.native import cpu_model

    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    print(
        f"python {platform.python_version()} on {platform.machine()}; {args.calls} no-op calls and"
        f" {args.slow_calls} 1 ms calls x {args.rounds} rounds, alternated; {args.items} items per"
        " generator call; medians of rounds"
    )
    if args.ladder:
        ladder(items=args.items, calls=args.calls, rounds=args.rounds)
        return
    print(
        f"{'kind':16} {'sampling':>8} | {'bare ns':>8} {'added ns':>8} {'empty':>6} | {'1ms bare us':>11}"
        f" {'added us':>8} {'share':>7} | target"
    )
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        for kind in kinds:
            row = measure(
                kind, rate, items=args.items, calls=args.calls, slow_calls=args.slow_calls, rounds=args.rounds
            )
            rows.append(row)
            verdict = ("met" if row.meets_target else "MISSED") if rate == 0.0 else "-"
            print(
                f"{kind:16} {rate:8.0%} | {row.bare_ns:8.0f} {row.added_ns:8.0f} {row.empty_ns:6.0f} |"
                f" {row.slow_bare_us:11.1f}"
                f" {row.slow_added_us:8.2f} {row.share:7.3%} | {verdict}",
                flush=True,
            )
    target_rows = [r for r in rows if r.rate == 0.0]
    if target_rows:
        met = [r.kind for r in target_rows if r.meets_target]
        missed = [r.kind for r in target_rows if not r.meets_target]
        print(
            f"target at 0% sampling (<= {TARGET_NS:.0f} ns added, <= {TARGET_SHARE:.0%} of a 1 ms call):"
            f" met for {', '.join(met) or 'none'}; missed for {', '.join(missed) or 'none'}"
        )


if __name__ == "__main__":
    main()
