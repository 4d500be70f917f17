"""SLA routing: a fast path and a standard path, two replicas in one runtime.

The standard path is the runtime's serving replica (`current`: deploys, rollbacks and
canaries act on it as without routing); the fast path is a second replica beside it, its
own KV cache, batch and pending queue (the canary's machinery, a second slot). Each
request is routed once, at submit, and never moves:

1. **classify**: a prompt within the fast path's `max_prompt_tokens` asking for at most its
   `max_new_tokens` is "short" (fast), anything else "long" (standard). A user classifier,
   `fn(RouteQuery) -> "fast" | "standard"`, decides among the short ones instead; one that
   raises or answers anything else sends the request to the standard path, counted
   (`reason="classifier_error"`), and never fails the request.
2. **spill over**: the predicted latency on the chosen path (waiting behind its queue, then
   its prefill and `max_new_tokens` decode steps at the batch it will run in, plus the other
   replica's step, since one loop thread steps both) comes from the step times each
   replica measures while it serves (step_times.py). When it is over the path's SLA and the
   other path predicts less, the request goes there (`reason="spill"`).
3. **length breaker**: per path, closed / open / half-open (`LengthBreaker`). While open,
   a request longer than the adaptive threshold is refused (`PathOverloaded`, the service's
   503 + Retry-After) or, with `breaker_action="standard"`, sent from the fast path to the
   standard one (`reason="breaker"`). Long requests are shed first: neither path's
   threshold falls below the requests the fast path is configured for (its
   `max_prompt_tokens` + `max_new_tokens`: a short one spilled to the standard path is not
   shed there either), and when the fast path misses its SLA while the standard path is
   busy (one loop thread steps both: the flood comes from there), the standard breaker
   opens with the fast path's lengths as its threshold (`RouteControl._pressure`). Half-open,
   a breaker lets `probes` requests over its threshold through, and sheds the rest until
   they are judged.

Each path's batch cap follows the 1-4-8-16 ladder: the rung that serves the most requests
per second while a typical request of the path, in a batch of that size, still finishes
within its SLA (`RouteControl.adapt`, `step_times.batch_cap`). One loop thread steps both
replicas, so before each step `RouteControl.hold` may keep the standard replica out of it
(no admission, no decode) while a fast request's deadline is at risk.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .deploy import RuntimeHost
from .errors import InvalidRequest, PathOverloaded, RuntimeNotRunning
from .events import BreakerChanged
from .runtime_loop import Swap, apply_swap
from .step_times import BATCH_LADDER, StepTimesSnapshot, batch_cap

if TYPE_CHECKING:
    from .replica import PendingQueue, Replica, Request

__all__ = [
    "PATHS",
    "BreakerState",
    "BreakerStatus",
    "LengthBreaker",
    "PathSpec",
    "RouteControl",
    "RouteDecision",
    "RouteQuery",
    "RoutingSpec",
]

PATHS = ("fast", "standard")
Path = Literal["fast", "standard"]
BreakerState = Literal["closed", "open", "half_open"]
MIN_MISSES = 2  # a closed breaker opens on two misses in its window at the least, never on one
PRESSURE_WINDOW = 20  # the fast path's recent completions judged for pressure on the standard path


@dataclass(frozen=True)
class RouteQuery:
    """What a user classifier sees: the prompt's token ids, the requested output, the text
    (None when the caller gave token ids only)."""

    prompt_ids: Sequence[int]
    max_new_tokens: int
    text: str | None


Classifier = Callable[[RouteQuery], str]


@dataclass(frozen=True)
class PathSpec:
    version: str
    sla_ms: float
    max_prompt_tokens: int | None = None  # the fast path's admission limits (None: no limit)
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RoutingSpec:
    fast: PathSpec
    standard: PathSpec
    classifier: Classifier | None = None
    breaker_action: Literal["reject", "standard"] = "reject"
    breaker_window: int = 50  # recent completions of a path whose p99 opens its breaker
    breaker_cooldown_s: float = 2.0  # open this long, then half-open
    breaker_probes: int = 5  # completions judged in half-open before closing

    def path(self, name: str) -> PathSpec:
        return self.fast if name == "fast" else self.standard


@dataclass(frozen=True)
class RouteDecision:
    path: Path
    reason: str  # "short", "long", "classifier", "classifier_error", "spill", "breaker"
    predicted_s: float | None  # predicted latency on `path` (None: not measured yet)


@dataclass(frozen=True)
class BreakerStatus:
    path: str
    state: BreakerState
    p99_ms: float | None
    threshold_tokens: int | None  # while open: longer requests are shed
    opened: int  # times opened since start


class LengthBreaker:
    """One path's breaker. Fed every finished request's (length, seconds); opens when the p99
    of the last `window` is over the SLA and at least `MIN_MISSES` of them missed it (over a
    window under 100 requests the p99 is its slowest one, and one scheduler hiccup or
    collector pause must not shed a path for a cooldown). The threshold adapts to what was measured: the
    longest request of the window that met the SLA and is shorter than every request that
    missed it (else one token under the shortest that missed): lengths that are still
    served in time keep being served. After `cooldown_s` it turns half-open and lets
    `probes` requests over the threshold through (the rest are still shed); `probes`
    completions within the SLA, or a further `cooldown_s` without a miss (the long traffic
    may have stopped), close it; one miss reopens it. The threshold never falls below
    `floor` (the lengths the path exists to serve)."""

    def __init__(self, path: str, sla_s: float, *, window: int, cooldown_s: float, probes: int,
                 clock: Callable[[], float] = time.monotonic, floor: int = 0) -> None:  # fmt: skip
        self.path = path
        self.floor = floor
        self._probes_let = 0  # requests over the threshold let through since half-open
        self.sla_s = sla_s
        self.cooldown_s = cooldown_s
        self.probes = probes
        self._clock = clock
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)
        self._lock = threading.Lock()
        self.state: BreakerState = "closed"
        self.threshold: int | None = None
        self._opened_at = 0.0
        self._half_open_at = 0.0
        self._probe_ok = 0
        self.opened = 0

    def p99_s(self) -> float | None:
        with self._lock:
            return _p99([s for _, s in self._recent])

    def observe(self, length: int, seconds: float) -> BreakerState | None:
        """One finished request; the new state when it changed."""
        with self._lock:
            self._recent.append((length, seconds))
            self._tick()
            if self.state == "half_open":
                if seconds > self.sla_s:
                    return self._open()
                self._probe_ok += 1
                return self._close() if self._probe_ok >= self.probes else None
            if self.state == "closed" and len(self._recent) >= min(20, self._recent.maxlen or 20):
                times = [s for _, s in self._recent]
                p99 = _p99(times)
                if p99 is not None and p99 > self.sla_s and sum(s > self.sla_s for s in times) >= MIN_MISSES:
                    return self._open()
            return None

    def admits(self, length: int) -> bool:
        """False while open for a request longer than the threshold; half-open, True for
        `probes` of them, then False until they are judged."""
        with self._lock:
            self._tick()
            if self.state == "closed" or self.threshold is None or length <= self.threshold:
                return True
            if self.state == "half_open" and self._probes_let < self.probes:
                self._probes_let += 1
                return True
            return False

    def force_open(self, threshold: int) -> BreakerState | None:
        """Open (or keep open, from now) with `threshold` (not below the floor), whatever this
        path measured: the other path pays for this one's load. The new state when it changed."""
        with self._lock:
            self._tick()
            changed: BreakerState | None = None if self.state == "open" else "open"
            if changed is not None:
                self.opened += 1
            self.state, self._opened_at = "open", self._clock()
            self.threshold = max(self.floor, threshold)
            return changed

    def retry_after_s(self) -> float:
        with self._lock:
            return max(1.0, self._opened_at + self.cooldown_s - self._clock())

    def tick(self) -> BreakerState | None:
        """Open -> half-open once the cooldown has passed; the new state when it changed."""
        with self._lock:
            return self._tick()

    def _tick(self) -> BreakerState | None:
        now = self._clock()
        if self.state == "open" and now - self._opened_at >= self.cooldown_s:
            self.state, self._probe_ok, self._half_open_at, self._probes_let = "half_open", 0, now, 0
            return "half_open"
        if self.state == "half_open" and now - self._half_open_at >= self.cooldown_s:
            return self._close()
        return None

    def _close(self) -> BreakerState:
        self.state, self.threshold = "closed", None
        self._recent.clear()  # the flood's latencies must not reopen it
        return "closed"

    def _open(self) -> BreakerState:
        missed = [n for n, s in self._recent if s > self.sla_s]
        shortest_miss = min(missed) if missed else None
        kept = [
            n for n, s in self._recent if s <= self.sla_s and (shortest_miss is None or n < shortest_miss)
        ]
        if kept:
            self.threshold = max(kept)
        elif shortest_miss is not None:
            self.threshold = max(0, shortest_miss - 1)
        if self.threshold is not None:
            self.threshold = max(self.floor, self.threshold)
        self.state, self._opened_at = "open", self._clock()
        self.opened += 1
        return "open"

    def status(self) -> BreakerStatus:
        p99 = self.p99_s()
        with self._lock:
            self._tick()
            return BreakerStatus(
                self.path, self.state, None if p99 is None else p99 * 1000.0, self.threshold, self.opened
            )


class RouteControl:
    """The runtime's handle for SLA routing (`runtime.routing`)."""

    def __init__(self, runtime: RuntimeHost) -> None:
        self._runtime = runtime
        self.spec: RoutingSpec | None = None
        self.breakers: dict[str, LengthBreaker] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._count_lock = threading.Lock()
        self._arrivals: dict[str, deque[float]] = {name: deque(maxlen=64) for name in PATHS}
        self._prompt_tokens: dict[str, float] = {}  # per path: mean prompt length (EWMA)
        self._fast_misses: deque[bool] = deque(maxlen=PRESSURE_WINDOW)  # recent fast completions: missed?
        self.held = 0  # steps the standard replica sat out for the fast path (`hold`)

    @property
    def active(self) -> bool:
        return self.spec is not None and self._runtime._state.fast is not None

    def start(self, spec: RoutingSpec) -> None:
        """Load the fast path's version beside the serving (standard) one, verified and
        warmed up like a deploy. Raises InvalidRequest when the serving version is not the
        standard path's, a DeployRefused subclass when the fast version cannot be served."""
        runtime = self._runtime
        for name in PATHS:
            if not spec.path(name).sla_ms > 0:
                raise InvalidRequest(f"routing.{name}.sla_ms must be positive, got {spec.path(name).sla_ms}")
        with runtime._deploy_lock:
            serving = runtime.serving_version
            if not runtime.is_running or serving is None:
                raise RuntimeNotRunning("runtime is not serving: call start() first")
            if serving != spec.standard.version:
                raise InvalidRequest(
                    f"routing.standard.version is {spec.standard.version} but {serving} serves"
                )
            replica, _ = runtime._prepare(spec.fast.version, "routing", from_version=serving)
            self.breakers = {
                name: LengthBreaker(name, spec.path(name).sla_ms / 1000.0, window=spec.breaker_window,
                                    cooldown_s=spec.breaker_cooldown_s, probes=spec.breaker_probes,
                                    floor=fast_lengths(spec))
                for name in PATHS
            }  # fmt: skip
            self._fast_misses.clear()
            self.spec = spec
            runtime._state.on_finished = self._finished
            runtime._state.hold = self.hold
            apply_swap(
                runtime._state,
                runtime._thread,
                Swap(replica=replica, reason="routing", kind="fast"),
                "the fast path",
            )

    def stop(self) -> None:
        """Back to one path: the fast replica finishes what it runs, its queue goes standard."""
        runtime = self._runtime
        with runtime._deploy_lock:
            if self._runtime._state.fast is not None and runtime.is_running:
                apply_swap(
                    runtime._state,
                    runtime._thread,
                    Swap(replica=None, reason="routing", kind="fast"),
                    "routing stop",
                )
            runtime._state.on_finished = None
            runtime._state.hold = None
            self.spec = None

    # -- deciding ------------------------------------------------------------------------

    def decide(self, prompt_ids: Sequence[int], max_new_tokens: int, text: str | None) -> RouteDecision:
        """Where a request goes; raises PathOverloaded when the breaker sheds it."""
        spec = self.spec
        n = len(prompt_ids)
        if spec is None:  # routing stopped meanwhile: the serving (standard) version takes it
            return RouteDecision("standard", "long", None)
        fits_fast = _within(spec.fast, n, max_new_tokens)
        path: Path = "fast" if fits_fast else "standard"
        reason = "short" if fits_fast else "long"
        if fits_fast and spec.classifier is not None:
            try:
                answer = spec.classifier(RouteQuery(prompt_ids, max_new_tokens, text))
                if answer not in PATHS:
                    raise ValueError(f"classifier answered {answer!r}, not fast or standard")
                path, reason = ("fast" if answer == "fast" else "standard"), "classifier"
            except Exception:  # a user's bug never fails the request: standard, counted
                path, reason = "standard", "classifier_error"
        predicted = self.predict_s(path, n, max_new_tokens)
        if predicted is not None and predicted > spec.path(path).sla_ms / 1000.0:
            other: Path = "standard" if path == "fast" else "fast"
            if other == "standard" or fits_fast:
                alternative = self.predict_s(other, n, max_new_tokens)
                if alternative is not None and alternative < predicted:
                    path, reason, predicted = other, "spill", alternative
        length = n + max_new_tokens
        breaker = self.breakers[path]
        if not breaker.admits(length):
            if (
                path == "fast"
                and spec.breaker_action == "standard"
                and self.breakers["standard"].admits(length)
            ):
                path, reason = "standard", "breaker"
                predicted = self.predict_s(path, n, max_new_tokens)
            else:
                self.count(path, "shed")
                raise PathOverloaded(
                    f"the {path} path is over its SLA: requests over {breaker.threshold} tokens "
                    f"(prompt + max_new_tokens) are refused for now",
                    path=path, retry_after_s=breaker.retry_after_s(),
                )  # fmt: skip
        self.count(path, reason)
        self._arrivals[path].append(time.monotonic())
        old = self._prompt_tokens.get(path)
        self._prompt_tokens[path] = n if old is None else old + 0.1 * (n - old)
        return RouteDecision(path, reason, predicted)

    def predict_s(self, path: str, prompt_tokens: int, max_new_tokens: int) -> float | None:
        """Predicted arrival-to-last-token seconds of a request submitted now on `path`,
        from measured step times (None until that path has served a request). The other
        replica's step counts beside each of this path's, except on the fast path when the
        request meets its SLA without it: the loop then holds the standard replica back."""
        replica, queue, other = self._sides(path)
        if replica is None:
            return None
        times = replica.step_times
        running, waiting, cap = len(replica.running), len(queue), max(1, replica.cap)
        decode = times.decode_s(min(cap, running + waiting + 1))
        prefill = times.prefill_s(prompt_tokens)
        if decode is None or prefill is None:
            return None
        beside = 0.0
        if other is not None and other.running:
            beside = other.step_times.decode_s(len(other.running)) or 0.0
        wait = 0.0
        free = cap - running
        if waiting >= free:
            service = times.service_s
            if service is None:
                return None
            wait = math.ceil((waiting - free + 1) / cap) * service
        alone = wait + prefill + max_new_tokens * decode
        spec = self.spec
        if path == "fast" and spec is not None and alone <= spec.fast.sla_ms / 1000.0:
            return alone
        return alone + max_new_tokens * beside

    def adapt(self) -> None:
        """Each path's batch cap, a rung of 1-4-8-16 (up to its KV slots), from its measured
        steps, prefill, output length and arrival rate (`batch_cap`: the most requests per
        second that still finish within the SLA in a batch of that size). The standard path
        counts the fast replica's step beside each of its own; the fast path does not, since
        the loop holds the standard replica back while a fast deadline is at risk (`hold`)."""
        spec = self.spec
        if spec is None:
            return
        for name in PATHS:
            replica, _, other = self._sides(name)
            if replica is None or replica.step_times.output_tokens is None:
                continue
            times = replica.step_times
            beside = 0.0
            if name == "standard" and other is not None and other.running:
                beside = other.step_times.decode_s(len(other.running)) or 0.0
            replica.cap = batch_cap(
                times,
                [c for c in BATCH_LADDER if c <= replica.max_batch] or [replica.max_batch],
                sla_s=spec.path(name).sla_ms / 1000.0,
                output_tokens=times.output_tokens or 1.0,
                prefill_s=times.prefill_s(int(self._prompt_tokens.get(name, 0.0))) or 0.0,
                beside_s=beside,
                arrival_rate=self.arrival_rate(name),
            )

    def arrival_rate(self, path: str) -> float:
        """Requests per second routed to `path`, over its last 64 arrivals."""
        arrivals = list(self._arrivals.get(path, ()))
        if len(arrivals) < 2:
            return 0.0
        span = max(time.monotonic() - arrivals[0], 1e-3)
        return (len(arrivals) - 1) / span

    def caps(self) -> dict[str, int]:
        return {name: r.cap for name in PATHS if (r := self._sides(name)[0]) is not None}

    def step_times(self) -> dict[str, StepTimesSnapshot]:
        """Each path's measured step times (what its cap and predictions come from)."""
        return {name: r.step_times.snapshot() for name in PATHS if (r := self._sides(name)[0]) is not None}

    def counts(self) -> dict[tuple[str, str], int]:
        """Requests routed so far by (path, reason); "shed" counts breaker refusals."""
        with self._count_lock:
            return dict(self._counts)

    def count(self, path: str, reason: str, *, instead_of: str | None = None) -> None:
        """One more request of `path` for `reason` (`instead_of`: one less for that reason,
        e.g. a request routed as "long" that admission control then refused: "overloaded")."""
        with self._count_lock:
            self._counts[(path, reason)] = self._counts.get((path, reason), 0) + 1
            if instead_of is not None and self._counts.get((path, instead_of), 0) > 0:
                self._counts[(path, instead_of)] -= 1

    def statuses(self) -> list[BreakerStatus]:
        statuses = []
        for breaker in self.breakers.values():
            self._note(breaker, breaker.tick())
            statuses.append(breaker.status())
        return statuses

    # -- the loop thread -----------------------------------------------------------------

    def hold(self) -> Replica | None:
        """Before each step (the loop thread): the replica to leave out of it. The standard
        replica sits the step out (no admission, no decode) when a fast request, running or
        about to be admitted (taken as arrived now, with the path's mean output), would miss
        its deadline with both replicas stepped but meets it with the fast one alone, and no
        running standard request that meets its own deadline now would miss it for the wait
        (the fast path's remaining steps). Predictions are the measured step times."""
        state, spec = self._runtime._state, self.spec
        fast, standard = state.fast, state.current
        if spec is None or fast is None or standard is None:
            return None
        joining = min(len(state.fast_queue), max(0, fast.cap - len(fast.running)))
        admitting = min(max(0, standard.cap - len(standard.running)), len(state.queue))
        if not (fast.running or joining) or not (standard.running or admitting):
            return None
        fast_step = fast.step_times.decode_s(len(fast.running) + joining)
        if fast_step is None:
            return None
        standard_step = standard.step_times.decode_s(len(standard.running)) or 0.0
        prompt = int(self._prompt_tokens.get("standard", 0))
        admission = admitting * (standard.step_times.prefill_s(prompt) or 0.0)  # this step's prefills
        now, fast_sla = time.monotonic(), spec.fast.sla_ms / 1000.0
        prefill = fast.step_times.prefill_s(int(self._prompt_tokens.get("fast", 0))) or 0.0
        newcomer = (now, max(1.0, fast.step_times.output_tokens or 1.0), prefill)
        fast_requests = [(r.arrival, r.max_new_tokens - len(r.tokens), 0.0) for r in fast.running.values()]
        at_risk, wait = False, 0.0
        for arrival, left, own in [*fast_requests, *[newcomer] * joining]:
            alone = now + own + left * fast_step
            at_risk = at_risk or alone <= arrival + fast_sla < alone + left * standard_step + admission
            wait = max(wait, alone - now)
        if not at_risk:
            return None
        standard_sla = spec.standard.sla_ms / 1000.0
        for r in standard.running.values():
            finish = now + (r.max_new_tokens - len(r.tokens)) * (standard_step + fast_step)
            if finish <= r.arrival + standard_sla < finish + wait:
                return None
        self.held += 1
        return standard

    def _finished(self, request: Request, seconds: float) -> None:
        path = request.path
        breaker = self.breakers.get(path) if path is not None else None
        if breaker is None:
            return
        self._note(breaker, breaker.observe(len(request.prompt_ids) + request.max_new_tokens, seconds))
        if path == "fast":
            self._pressure(seconds > breaker.sla_s)
        if breaker.state == "closed":
            self.adapt()

    def _pressure(self, missed: bool) -> None:
        """A fast completion (the loop thread): when `MIN_MISSES` of the fast path's last
        `PRESSURE_WINDOW` missed its SLA while the standard path has work, the standard
        breaker opens (or stays open) shedding what the fast path does not serve: the long
        requests go first, before any short one."""
        spec, state = self.spec, self._runtime._state
        self._fast_misses.append(missed)
        if spec is None or not missed or sum(self._fast_misses) < MIN_MISSES:
            return
        standard = state.current
        if standard is None or not (standard.running or len(state.queue)):
            return
        self._fast_misses.clear()  # judged afresh: two more misses keep it open
        breaker = self.breakers["standard"]
        self._note(breaker, breaker.force_open(fast_lengths(spec)))

    def _note(self, breaker: LengthBreaker, changed: BreakerState | None) -> None:
        if changed is None:
            return
        p99 = breaker.p99_s()
        self._runtime._state.post(BreakerChanged(
            breaker.path, changed, time.time(), None if p99 is None else p99 * 1000.0, breaker.threshold,
        ))  # fmt: skip
        self._runtime._state.wake.set()

    def _sides(self, path: str) -> tuple[Replica | None, PendingQueue, Replica | None]:
        state = self._runtime._state
        if path == "fast":
            return state.fast, state.fast_queue, state.current
        return state.current, state.queue, state.fast


def fast_lengths(spec: RoutingSpec) -> int:
    """The longest request (prompt + max_new_tokens) the fast path is configured for (0: no bound)."""
    fast = spec.fast
    if fast.max_prompt_tokens is None:
        return 0
    return fast.max_prompt_tokens + (fast.max_new_tokens or 0)


def _within(spec: PathSpec, prompt_tokens: int, max_new_tokens: int) -> bool:
    return (spec.max_prompt_tokens is None or prompt_tokens <= spec.max_prompt_tokens) and (
        spec.max_new_tokens is None or max_new_tokens <= spec.max_new_tokens
    )


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
