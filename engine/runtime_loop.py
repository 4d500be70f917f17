"""The runtime's serving loop: what it shares with callers (`LoopState`), the swaps that
change which replicas serve, and the loop thread that admits, steps and samples every replica
(the requests, their queue and the replicas it drives are in replica.py).

Callers reach the loop only through `LoopState`'s thread-safe hand-offs (runtime.py);
everything else here belongs to the loop thread.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .errors import GenerationFailed, RuntimeNotRunning
from .events import (
    EngineEvent,
    FinishReason,
    RequestFailed,
    RequestFinished,
    RequestStarted,
    TokenEmitted,
    VersionDeployed,
)
from .replica import PendingQueue, Replica, Request
from .requests import Completion, sample_requests

# PendingQueue, Replica and Request are re-exported: callers imported them from here before
# they moved to replica.py
__all__ = ["IdleWork", "LoopState", "PendingQueue", "Replica", "Request", "Swap", "apply_swap", "run_loop"]


# ==============================================================================================
# The loop thread of `Runtime`: what it shares with callers (`LoopState`) and one step.
# Callers touch the shared state only through thread-safe hand-offs: the pending queue,
# deques of posted events, cancellations and swaps, and the `wake` event. Everything else
# (replicas, running requests, subscribers' calls) belongs to the loop thread.
# ==============================================================================================


_IDLE_WAIT_S = 1.0


class IdleWork(Protocol):
    """Work the loop does in a step where no live request waits, and, while they keep
    waiting, only what is overdue (runtime_shadow.py scores pairs with it)."""

    def run_one(self, *, overdue_only: bool = False) -> bool:
        """Do at most one job -> whether there was one; with `overdue_only` (live requests
        wait) only one that has waited too long already."""
        ...

    def give_up(self) -> None:
        """The loop ends: finish every job left without doing it."""
        ...


@dataclass(eq=False)
class Swap:
    """A validated replica waiting to become the serving one."""

    replica: Replica | None
    reason: str
    kind: str = "swap"  # "swap"; "canary" (serve beside); "promote"/"abort" it; "fast" (routing); "shadow"
    done: threading.Event = field(default_factory=threading.Event)
    applied: bool = False
    at: float = 0.0


@dataclass(eq=False)
class LoopState:
    queue: PendingQueue
    current: Replica | None = None
    canary: Replica | None = None  # a candidate serving beside `current`, its own queue and cache
    canary_queue: PendingQueue = field(default_factory=PendingQueue)
    fast: Replica | None = None  # SLA routing: the fast path's replica beside `current` (the standard one)
    fast_queue: PendingQueue = field(default_factory=PendingQueue)
    shadow: Replica | None = None  # the previous version, kept after a deploy to answer shadows
    shadow_slots: int | None = None  # batch slots shadows may hold per replica (None: a quarter)
    # called with each finished request and its arrival-to-last-token seconds (SLA routing)
    on_finished: Callable[[Request, float], None] | None = None
    hold: Callable[[], Replica | None] | None = None  # before each step: a replica to sit it out
    idle_work: IdleWork | None = None  # one job a step: when no live request waits, or overdue
    draining: list[Replica] = field(default_factory=list)
    wake: threading.Event = field(default_factory=threading.Event)
    submit_lock: threading.Lock = field(default_factory=threading.Lock)
    posted: collections.deque[EngineEvent] = field(default_factory=collections.deque)
    cancels: collections.deque[Request] = field(default_factory=collections.deque)
    swaps: collections.deque[Swap] = field(default_factory=collections.deque)
    accepting: bool = False
    stopping: bool = False
    cancel_all: bool = False
    emit: Callable[[EngineEvent], None] = lambda event: None
    subscriber_errors: int = 0
    running_count: int = 0
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    crashed: BaseException | None = None

    def post(self, event: EngineEvent) -> None:
        """Deliver `event` to subscribers from the loop thread, in posting order."""
        self.posted.append(event)

    def cancel(self, request: Request) -> None:
        self.cancels.append(request)
        self.wake.set()

    def request_swap(self, swap: Swap) -> None:
        self.swaps.append(swap)
        self.wake.set()

    def shared_generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self.generators:
            generator = torch.Generator(device=device)
            generator.seed()
            self.generators[key] = generator
        return self.generators[key]


def apply_swap(state: LoopState, thread: threading.Thread | None, swap: Swap, what: str) -> Swap:
    """Hand `swap` to the loop and wait until it is applied between two steps; raises
    RuntimeNotRunning when the loop ended first (`what` names the change in the message)."""
    state.request_swap(swap)
    while not swap.done.wait(timeout=0.5):
        if thread is None or not thread.is_alive():
            break
    if not swap.applied:
        raise RuntimeNotRunning(f"runtime stopped before {what} was applied")
    return swap


def run_loop(state: LoopState) -> None:
    with torch.inference_mode():
        try:
            _serve(state)
        except Exception as exc:  # a bug here must fail the requests, not leave them hanging
            state.crashed = exc
            with state.submit_lock:
                state.accepting = False
            for request in [
                *state.queue.drain(),
                *state.canary_queue.drain(),
                *state.fast_queue.drain(),
                *(r for rep in _replicas(state) for r in rep.running.values()),
            ]:
                if not request.finished:
                    _fail(state, request, exc)
            raise
        finally:
            with state.submit_lock:
                state.accepting = False
            _cancel_everything(state)
            while state.swaps:
                state.swaps.popleft().done.set()  # not applied: the deploy raises
            if state.idle_work is not None:
                state.idle_work.give_up()
            _flush(state)


def _serve(state: LoopState) -> None:
    while True:
        state.wake.clear()
        _flush(state)
        _apply_swaps(state)
        _apply_cancels(state)
        if state.cancel_all:
            _cancel_everything(state)
        worked = _step(state)
        state.draining = [r for r in state.draining if r.running]
        state.running_count = sum(len(r.running) for r in _replicas(state))
        waiting = len(state.queue) + len(state.canary_queue) + len(state.fast_queue)
        if state.stopping and not worked and not state.running_count and not waiting:
            return
        if not worked:
            state.wake.wait(_IDLE_WAIT_S)


def _step(state: LoopState) -> bool:
    """Admit, prefill, decode and sample once. False when there was nothing to do."""
    current = state.current
    if current is None:
        return False
    if state.canary is None and len(state.canary_queue):  # routed just before the canary ended
        for request in state.canary_queue.drain():
            state.queue.push(request)
    groups: list[tuple[list[Request], torch.Tensor]] = []
    if state.fast is None and len(state.fast_queue):  # routed just before the fast path went
        for request in state.fast_queue.drain():
            state.queue.push(request)
    held = state.hold() if state.hold is not None else None  # SLA routing: the fast path first
    busy = {id(r): r.busy_s for r in _replicas(state)}  # to charge this step's forwards
    paths = ((state.fast, state.fast_queue), (current, state.queue), (state.canary, state.canary_queue))
    for replica, queue in paths:
        if replica is not None and replica is not held:
            _admit(state, replica, queue, groups)
    idle = False
    if not (len(state.queue) or len(state.canary_queue)):  # shadows only with no live request waiting
        for replica in (r for r in (current, state.canary, state.shadow) if r is not None and r is not held):
            limit = state.shadow_slots or max(1, replica.max_batch // 4)
            _admit(state, replica, replica.shadow_queue, groups, limit)
        idle = state.idle_work is not None and state.idle_work.run_one()
    elif state.idle_work is not None:  # busy: only work that waited too long, one job
        idle = state.idle_work.run_one(overdue_only=True)
    for replica in _replicas(state):  # one batch per replica: versions never share one
        batch = [r for r in replica.running.values() if r.tokens]
        if not batch or replica is held:
            continue
        try:
            groups.append((batch, replica.decode(batch)))
        except Exception as exc:
            for request in batch:
                _fail(state, request, exc)
    if not groups:
        return idle
    _charge_others(state, busy)
    requests = [r for batch, _ in groups for r in batch]
    try:
        sampled = [
            sample_requests(logits, batch, state.shared_generator(logits.device)) for batch, logits in groups
        ]
        tokens = torch.cat(sampled).tolist()  # the one device-to-host read of the step
        logprobs = _pair_logprobs(groups, sampled)  # and a second only when a pair's side ran
    except Exception as exc:
        for request in requests:
            _fail(state, request, exc)
        return True
    for i, logprob in logprobs.items():  # summed before a finish below settles the pair
        tracked = requests[i]
        if tracked.logprob is not None and not tracked.finished:
            tracked.logprob += logprob
    now, wall = time.monotonic(), time.time()
    for request, token in zip(requests, tokens, strict=True):
        _deliver(state, request, int(token), now, wall)
    return True


def _pair_logprobs(
    groups: list[tuple[list[Request], torch.Tensor]], sampled: list[torch.Tensor]
) -> dict[int, float]:
    """Each tracked request's (`Request.logprob` not None) sampled token's log-probability at
    temperature 1, by its index in the step's requests: one gather per group that has one."""
    index: list[int] = []
    parts: list[torch.Tensor] = []
    offset = 0
    for (batch, logits), tokens in zip(groups, sampled, strict=True):
        rows = [i for i, r in enumerate(batch) if r.logprob is not None]
        if rows:
            at = torch.tensor(rows, dtype=torch.long, device=logits.device)
            picked = tokens.index_select(0, at).to(torch.long)[:, None]  # [R, 1]
            lsm = torch.log_softmax(logits.index_select(0, at).float(), dim=-1)  # [R, V]
            parts.append(lsm.gather(1, picked)[:, 0])
            index += [offset + i for i in rows]
        offset += len(batch)
    return dict(zip(index, torch.cat(parts).tolist(), strict=True)) if parts else {}


def _charge_others(state: LoopState, busy: dict[int, float]) -> None:
    """Each running request waited, this step, on the forwards of every other version (the
    loop runs them in turn before any token goes out). Summed per request so that a release
    check compares two versions net of each other's load: beside a slow stable version a
    faster canary's requests would otherwise look the slower. On an asynchronous device the
    forwards return before they finish and little is charged. `busy`: each replica's
    `busy_s` (its own timing of its forwards) when the step began."""
    spent: dict[str, float] = {}
    for replica in _replicas(state):
        step = replica.busy_s - busy.get(id(replica), replica.busy_s)
        spent[replica.version] = spent.get(replica.version, 0.0) + step
    total = sum(spent.values())
    for replica in _replicas(state):
        others = total - spent.get(replica.version, 0.0)
        if others > 0.0:
            for request in replica.running.values():
                request.others_s += others


def _admit(
    state: LoopState, replica: Replica, queue: PendingQueue, groups: list[tuple[list[Request], torch.Tensor]],
    shadows: int | None = None,  # `queue` holds shadows: at most this many running on `replica`
) -> None:  # fmt: skip
    admitted: list[Request] = []
    prefilled: list[torch.Tensor] = []
    while replica.has_free_slot and not state.cancel_all:
        if shadows is not None and sum(r.shadow for r in replica.running.values()) >= shadows:
            break
        _flush(state)  # RequestQueued goes out before RequestStarted
        request = queue.pop()
        if request is None:
            break
        if request.finished:
            continue
        _start(state, replica, request)
        try:
            prefilled.append(replica.prefill(request))
        except Exception as exc:
            _fail(state, request, exc)
            continue
        admitted.append(request)
    if admitted:
        groups.append((admitted, torch.stack(prefilled)))


def _start(state: LoopState, replica: Replica, request: Request) -> None:
    replica.admit(request)
    request.replica = replica
    request.started = time.monotonic()
    request.handle._started(replica.version)
    if request.seed is not None and request.temperature > 0.0:
        request.generator = torch.Generator(device=replica.device).manual_seed(request.seed)
    state.emit(
        RequestStarted(request.request_id, replica.version, time.time(), request.started - request.arrival)
    )


def _deliver(state: LoopState, request: Request, token: int, now: float, wall: float) -> None:
    if request.finished:
        return
    request.tokens.append(token)
    if request.first_token is None:
        request.first_token = now
    request.last_token = now
    version = request.version or ""
    state.emit(
        TokenEmitted(request.request_id, version, wall, len(request.tokens) - 1, token, now - request.arrival)
    )
    request.handle._push(token)
    replica = request.replica
    if replica is not None and token in replica.eos_ids:
        _finish(state, request, "stop")
    elif len(request.tokens) >= request.max_new_tokens:
        _finish(state, request, "length")


def _finish(state: LoopState, request: Request, reason: FinishReason) -> None:
    now = time.monotonic()
    request.finished = True
    if request.replica is not None:
        request.replica.release(request)
        if request.started is not None and reason != "cancelled":
            request.replica.step_times.observe_service(now - request.started, len(request.tokens))
    version = request.version or request.handle.model_version
    queue_s = (request.started if request.started is not None else now) - request.arrival
    ttft = None if request.first_token is None else request.first_token - request.arrival
    duration = (request.last_token if request.last_token is not None else now) - request.arrival
    prompt, output = len(request.prompt_ids), len(request.tokens)
    others = min(request.others_s, duration)
    if state.on_finished is not None and reason != "cancelled":
        try:
            state.on_finished(request, duration)
        except Exception:  # like a subscriber: never breaks serving
            state.subscriber_errors += 1
    state.emit(
        RequestFinished(
            request.request_id, version, time.time(), prompt, output, queue_s, ttft, duration, reason, others
        )
    )
    request.handle._finish(
        Completion(
            request.request_id, version, prompt, tuple(request.tokens), reason, queue_s, ttft, duration
        )
    )


def _fail(state: LoopState, request: Request, exc: Exception) -> None:
    request.finished = True
    if request.replica is not None:
        request.replica.release(request)
    version = request.version or request.handle.model_version
    message = f"{type(exc).__name__}: {exc}"
    state.emit(RequestFailed(request.request_id, version, time.time(), type(exc).__name__, message))
    error = GenerationFailed(f"request {request.request_id} failed on {version}: {message}")
    error.__cause__ = exc
    request.handle._fail(error)


def _flush(state: LoopState) -> None:
    while state.posted:
        state.emit(state.posted.popleft())


def _apply_swaps(state: LoopState) -> None:
    while state.swaps:
        swap = state.swaps.popleft()
        if swap.kind == "canary":
            state.canary = swap.replica
        elif swap.kind == "fast":  # SLA routing's fast path starts (a replica) or ends (None)
            old_fast, state.fast = state.fast, swap.replica
            if old_fast is not None and old_fast.running:
                state.draining.append(old_fast)
        elif swap.kind == "shadow":  # runtime_shadow.py: the previous version kept beside, or let go
            old_shadow, state.shadow = state.shadow, swap.replica
            state.draining = [r for r in state.draining if r is not swap.replica]
            if old_shadow is not None and old_shadow.running:
                state.draining.append(old_shadow)
        elif swap.kind == "abort":
            _drop_canary(state)
        else:  # "swap", or "promote": the canary's replica (and its running requests) serves all
            if swap.kind == "promote":
                swap.replica, state.canary = state.canary, None
                for request in state.canary_queue.drain():
                    state.queue.push(request)
            old = state.current
            if swap.replica is not None:
                state.current = swap.replica
                if old is not None and old.running:
                    state.draining.append(old)
                state.emit(
                    VersionDeployed(
                        old.version if old else None, swap.replica.version, time.time(), swap.reason
                    )
                )
        swap.at = time.time()
        swap.applied = True
        swap.done.set()


def _drop_canary(state: LoopState) -> None:
    """The canary stops taking requests: those running finish on it (a request never
    changes version mid-stream); those not started yet go to the stable version."""
    canary, state.canary = state.canary, None
    if canary is not None and canary.running:
        state.draining.append(canary)
    for request in state.canary_queue.drain():
        state.queue.push(request)


def _apply_cancels(state: LoopState) -> None:
    while state.cancels:
        request = state.cancels.popleft()
        if request.finished:
            continue
        waiting = (
            state.queue.remove(request)
            or state.canary_queue.remove(request)
            or state.fast_queue.remove(request)
        )
        if waiting or request.replica is not None:
            _finish(state, request, "cancelled")


def _cancel_everything(state: LoopState) -> None:
    for request in [*state.queue.drain(), *state.canary_queue.drain(), *state.fast_queue.drain()]:
        if not request.finished:
            _finish(state, request, "cancelled")
    for replica in _replicas(state):
        for request in list(replica.running.values()):
            _finish(state, request, "cancelled")


def _replicas(state: LoopState) -> list[Replica]:
    return [*state.draining, *filter(None, (state.current, state.canary, state.fast, state.shadow))]
