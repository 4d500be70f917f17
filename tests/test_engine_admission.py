"""Admission control and the length breaker's order of shedding (issue 22, section 1):
a bounded queue per path and priority, a limit on predicted wait, the fast path's threshold
never below what it serves, long requests shed first, and half-open probes. Controlled
clocks and counted work: nothing here depends on how fast the machine is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from infersight.engine.admission import Admission, AdmissionLimits, predicted_wait_s
from infersight.engine.errors import InvalidRequest, QueueFull
from infersight.engine.registry import Registry
from infersight.engine.routing import LengthBreaker, PathSpec, RoutingSpec, fast_lengths
from infersight.engine.runtime import Runtime
from infersight.engine.runtime_loop import PendingQueue, Request
from infersight.engine.step_times import StepTimes

LONG = list(range(1000, 1200))  # 200 tokens


class _Replica:
    """The two things admission reads of a replica: its cap, its running requests, its step times."""

    def __init__(self, cap: int, running: int, service_s: float | None) -> None:
        self.cap = cap
        self.running = dict.fromkeys(range(running))
        self.step_times = StepTimes()
        if service_s is not None:
            self.step_times.observe_service(service_s, 10)


def _queue(*priorities: int) -> PendingQueue:
    queue = PendingQueue()
    for i, p in enumerate(priorities):
        queue.push(Request(f"r{i}", [1], 1, 0.0, 1.0, None, p, None, 0.0))  # type: ignore[arg-type]
    return queue


def test_a_full_queue_refuses_with_retry_after_and_a_higher_priority_is_still_admitted() -> None:
    admission = Admission(AdmissionLimits(max_queue=4))
    replica: Any = _Replica(cap=2, running=2, service_s=3.0)
    full = _queue(0, 0, 0, 0)
    with pytest.raises(QueueFull) as refused:
        admission.check(full, replica, priority=0, path="standard")
    assert refused.value.waiting == 4 and refused.value.retry_after_s == pytest.approx(3.0)
    assert "max_queue=4" in str(refused.value)
    admission.check(full, replica, priority=1, path="standard")  # nobody is ahead of it
    admission.check(_queue(0, 0, 0), replica, priority=0, path="standard")  # three ahead: room
    assert admission.refused == {"standard": 1}


def test_a_predicted_wait_over_the_limit_is_refused_once_the_replica_has_measured_one() -> None:
    limits = AdmissionLimits(max_queue_wait_s=10.0)
    cold: Any = _Replica(cap=4, running=4, service_s=None)
    assert predicted_wait_s(40, cold) is None
    Admission(limits).check(
        _queue(*[0] * 40), cold, priority=0, path="standard"
    )  # nothing measured: admitted
    warm: Any = _Replica(cap=4, running=4, service_s=2.0)
    assert predicted_wait_s(3, warm) == pytest.approx(2.0)  # one batch of 4 ahead of it
    assert predicted_wait_s(7, warm) == pytest.approx(4.0)
    assert predicted_wait_s(1, _Replica(cap=4, running=2, service_s=2.0)) == 0.0  # a free slot for it
    Admission(limits).check(_queue(*[0] * 19), warm, priority=0, path="fast")  # 5 batches: 10 s
    with pytest.raises(QueueFull, match=r"predicted wait on the fast path is 12\.0 s"):
        Admission(limits).check(_queue(*[0] * 20), warm, priority=0, path="fast")


def test_admission_limits_refuse_nonsense() -> None:
    with pytest.raises(InvalidRequest):
        AdmissionLimits(max_queue=0)
    with pytest.raises(InvalidRequest):
        AdmissionLimits(max_queue_wait_s=-1.0)


def test_a_runtime_with_a_bounded_queue_refuses_the_flood_and_admits_a_higher_priority(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    registry = private_copy(
        shared_demo_registry(tmp_path_factory), tmp_path_factory.mktemp("adm") / "registry"
    )
    runtime = Runtime(
        Registry(registry), max_batch_size=4, max_prompt_tokens=256, max_seq_len=512,
        admission=AdmissionLimits(max_queue=8),
    )  # fmt: skip
    runtime.start(GOOD)
    try:
        handles, refused = [], []
        for _ in range(100):  # submit returns at once: 4 run, 8 wait, the rest are refused
            try:
                handles.append(runtime.submit(LONG, max_new_tokens=200))
            except QueueFull as exc:
                refused.append(exc)
        # admitted: never more than the slots and the queue hold at once (4 + 8) plus the requests
        # that finished and freed a slot meanwhile, however fast or slow the machine is
        finished = sum(1 for h in handles if h.done)
        assert refused and len(handles) + len(refused) == 100 and len(handles) <= 4 + 8 + finished
        assert refused[0].retry_after_s >= 1.0  # the floor of Retry-After (admission.py), not a timing
        urgent = runtime.submit(LONG[:10], max_new_tokens=1, priority=1)  # none ahead of it: admitted
        assert urgent.request_id and runtime.admission.refused["standard"] == len(refused)
    finally:
        runtime.stop(drain=False)


def test_the_fast_paths_threshold_never_falls_below_what_it_is_configured_for() -> None:
    spec = RoutingSpec(PathSpec("f", 100.0, max_prompt_tokens=32, max_new_tokens=8), PathSpec("s", 250.0))
    assert fast_lengths(spec) == 40
    breaker = LengthBreaker("fast", 0.1, window=50, cooldown_s=2.0, probes=5, clock=lambda: 0.0, floor=40)
    for _ in range(30):  # every request of the path misses: a flood elsewhere slows them all
        breaker.observe(12, 0.5)
    assert breaker.state == "open" and breaker.threshold == 40  # not 11: the short ones are served
    assert breaker.admits(12) and breaker.admits(40) and not breaker.admits(41)


def test_a_forced_open_breaker_sheds_long_requests_and_half_open_lets_only_the_probes_through() -> None:
    now = [0.0]
    breaker = LengthBreaker("standard", 0.25, window=50, cooldown_s=2.0, probes=3, clock=lambda: now[0])
    assert breaker.force_open(40) == "open" and breaker.force_open(40) is None  # kept open, counted once
    assert breaker.status().opened == 1
    assert breaker.admits(40) and not breaker.admits(300)
    now[0] += 2.5
    assert breaker.tick() == "half_open"
    assert [breaker.admits(300) for _ in range(5)] == [True, True, True, False, False]  # 3 probes
    assert breaker.admits(30)  # within the threshold: never counted as a probe
    assert [breaker.observe(300, 0.1) for _ in range(3)][-1] == "closed"  # the probes met the SLA
    assert breaker.admits(300)


def _long_flood_spec(fast_sla_ms: float) -> RoutingSpec:
    return RoutingSpec(
        PathSpec("mixtral_banking_int8-v1.0", fast_sla_ms, max_prompt_tokens=32, max_new_tokens=8),
        PathSpec(GOOD, 60_000.0), breaker_cooldown_s=600.0,
    )  # fmt: skip


def test_fast_misses_while_the_standard_path_is_busy_open_the_standard_breaker_not_the_short_ones(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from infersight.engine.errors import PathOverloaded

    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp_path / "registry")
    runtime = Runtime(Registry(registry), max_batch_size=4, max_prompt_tokens=256, max_seq_len=512)
    runtime.start(GOOD)
    # a 1e-6 ms fast SLA: every fast completion misses, whatever the machine (counted work)
    runtime.routing.start(_long_flood_spec(1e-6))
    try:
        longs = [
            runtime.submit(LONG, max_new_tokens=400 - len(LONG)) for _ in range(4)
        ]  # the standard path busy
        for _ in range(2):
            runtime.submit(LONG[:12], max_new_tokens=2).result(120)  # two fast misses
        standard = next(b for b in runtime.routing.statuses() if b.path == "standard")
        fast = next(b for b in runtime.routing.statuses() if b.path == "fast")
        assert standard.state == "open" and standard.threshold_tokens == 40
        assert fast.state == "closed"
        with pytest.raises(PathOverloaded) as shed:
            runtime.submit(LONG, max_new_tokens=8)
        assert shed.value.path == "standard"
        assert runtime.submit(LONG[:12], max_new_tokens=2).result(120).token_ids  # short ones go on
        for h in longs:
            h.cancel()
    finally:
        runtime.stop(drain=False)


def _submit(admission: Admission, queue: PendingQueue, replica: Any, user: str | None, i: int) -> bool:
    """One request of `user` at submit: admitted (queued) or refused (QueueFull)."""
    try:
        admission.check(queue, replica, priority=0, path="canary", user=user)
    except QueueFull:
        return False
    queue.push(Request(f"{user}-{i}", [1], 1, 0.0, 1.0, None, 0, None, 0.0, user=user))  # type: ignore[arg-type]
    return True


def test_one_tenants_burst_is_refused_over_its_share_and_the_other_users_are_still_admitted() -> None:
    replica: Any = _Replica(cap=4, running=4, service_s=1.0)
    # first come, first served (no users): the burst of 24 connections fills the queue and
    # everyone behind it is refused
    fifo, fifo_queue = Admission(AdmissionLimits(max_queue=8)), PendingQueue()
    assert sum(_submit(fifo, fifo_queue, replica, None, i) for i in range(24)) == 8
    assert not _submit(fifo, fifo_queue, replica, None, 100)
    # by user: the tenant alone may hold half the queue, the rest stays for the others
    admission, queue = Admission(AdmissionLimits(max_queue=8)), PendingQueue()
    admitted = [_submit(admission, queue, replica, "tenant", i) for i in range(24)]
    assert admitted.count(True) == 4 and admitted[:4] == [True] * 4
    assert [_submit(admission, queue, replica, u, 0) for u in ("alice", "bob", "carol")] == [True] * 3
    assert not _submit(admission, queue, replica, "tenant", 99)  # still over its share (8 // 5)
    assert _submit(admission, queue, replica, "dave", 0)  # the last place goes to a newcomer
    assert not _submit(admission, queue, replica, "erin", 0)  # the queue is full: max_queue holds
    assert admission.refused_over_share == {"canary": 21} and admission.refused == {"canary": 22}
    assert queue.pop() is not None  # the tenant's first request leaves for a slot: room again
    with pytest.raises(QueueFull, match="user 'tenant' has 3 requests waiting on the canary path"):
        admission.check(queue, replica, priority=0, path="canary", user="tenant")  # share 8 // 6
    assert _submit(admission, queue, replica, "erin", 1)  # the place goes to another user
