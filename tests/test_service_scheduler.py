"""Jobs never pile up, and only one replica runs the leader-only jobs on a shared database."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from _service_support import auth, config, event, running, wait_for
from infersight.monitor.service.jobs import (
    SERVICE_GC_THRESHOLD0,
    FileLeaderLock,
    PostgresLeaderLock,
    ServiceScheduler,
    leader_lock_for,
)
from infersight.monitor.service.metrics import ServiceMetrics
from infersight.monitor.store import connect
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text


def _scheduler(leader=None) -> ServiceScheduler:  # type: ignore[no-untyped-def]
    return ServiceScheduler(ServiceMetrics(CollectorRegistry()), leader)


def test_a_slow_job_never_runs_twice_at_once_and_skipped_runs_are_counted() -> None:
    sched = _scheduler()
    running = 0
    most = 0
    runs = 0
    lock = threading.Lock()

    def slow() -> None:
        nonlocal running, most, runs
        with lock:
            running += 1
            runs += 1
            most = max(most, running)
        time.sleep(0.35)
        with lock:
            running -= 1

    sched.add("slow", slow, 0.05)
    sched.start()
    # counted, not timed: three runs of 0.35 s span at least 0.7 s of 0.05-s ticks
    wait_for(lambda: runs >= 3 and sched.metrics.job_skipped.labels("slow")._value.get() >= 3, timeout=60)
    sched.shutdown(wait=True)
    assert most == 1  # never two at once
    skipped = sched.metrics.job_skipped.labels("slow")._value.get()
    assert skipped >= 3  # the ticks that found it running were skipped, and counted


def test_a_failing_job_is_counted_and_keeps_its_schedule() -> None:
    sched = _scheduler()
    calls = []

    def boom() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    sched.add("boom", boom, 0.05, run_now=True)
    sched.start()
    wait_for(lambda: len(calls) >= 3, timeout=30)
    sched.shutdown()
    assert sched.metrics.job_runs.labels("boom", "error")._value.get() >= 3


def test_two_replicas_on_one_postgres_elect_one_leader_and_fail_over(postgres_url: str) -> None:
    a_engine, b_engine = connect(postgres_url), connect(postgres_url)
    a, b = PostgresLeaderLock(a_engine), PostgresLeaderLock(b_engine)
    assert a.is_leader() and not b.is_leader()
    assert a.is_leader() and not b.is_leader()  # stable
    a.release()
    assert b.is_leader() and not a.is_leader()
    # the leader's connection dies (a crashed replica): the lock goes with it
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid <> pg_backend_pid()"
        ))  # fmt: skip
    assert wait_for(lambda: a.is_leader(), timeout=10)
    assert not b.is_leader()
    a.release()
    b.release()
    for e in (a_engine, b_engine, admin):
        e.dispose()


_REPLICA = textwrap.dedent(
    """
    import sys, time
    from prometheus_client import CollectorRegistry
    from infersight.monitor.service.jobs import ServiceScheduler, leader_lock_for
    from infersight.monitor.service.metrics import ServiceMetrics
    from infersight.monitor.store import connect

    url, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    engine = connect(url)
    sched = ServiceScheduler(ServiceMetrics(CollectorRegistry()), leader_lock_for(engine))
    def evaluate():
        with open(out, "a") as fh:
            fh.write(f"{time.time()}\\n")
    sched.add("rules", evaluate, 0.1, leader_only=True, run_now=True)
    sched.start()
    time.sleep(seconds)
    sched.shutdown()
    """
)


def test_two_real_replica_processes_evaluate_rules_in_one_of_them_only(
    postgres_url: str, tmp_path: Path
) -> None:
    outs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [subprocess.Popen([sys.executable, "-c", _REPLICA, postgres_url, str(out), "3"]) for out in outs]
    for p in procs:
        assert p.wait(60) == 0
    times = [[float(t) for t in out.read_text().split()] if out.exists() else [] for out in outs]
    first, second = sorted(times, key=lambda ts: ts[0] if ts else float("inf"))
    assert len(first) >= 10, times  # the leader evaluated every 0.1 s
    # the other evaluated only after the leader had exited (failover), never at the same time
    assert not second or second[0] > first[-1], (first[-3:], second[:3])


def test_sqlite_replicas_on_one_host_share_a_lock_file(tmp_path: Path) -> None:
    a, b = FileLeaderLock(tmp_path / "x.lock"), FileLeaderLock(tmp_path / "x.lock")
    # flock is per open file description: two instances in one process behave like two processes
    assert a.is_leader() and not b.is_leader()
    a.release()
    assert b.is_leader()
    b.release()
    engine = connect(f"sqlite:///{tmp_path}/db.sqlite")
    assert isinstance(leader_lock_for(engine), FileLeaderLock)
    engine.dispose()


def test_the_running_service_collects_young_garbage_less_often_and_gives_the_thresholds_back(
    tmp_path: Path,
) -> None:
    before = gc.get_threshold()
    assert before[0] != SERVICE_GC_THRESHOLD0  # the process's own setting, whatever it is
    with running(config(tmp_path)) as (_, client):
        running_threshold = gc.get_threshold()
        frozen = gc.get_freeze_count()
        got = client.post("/api/v1/events", json={"events": [event(i) for i in range(50)]}, headers=auth())
        assert got.status_code == 200, got.text
    assert running_threshold == (SERVICE_GC_THRESHOLD0, before[1], before[2])
    assert frozen > 0  # start-up's objects out of the collector's runs while it ran
    assert gc.get_threshold() == before  # stopped: as it was
    assert gc.get_freeze_count() == 0
