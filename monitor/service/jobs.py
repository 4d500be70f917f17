"""The service's periodic jobs on APScheduler 3's `BackgroundScheduler`.

Every job runs with `max_instances=1` and `coalesce=True`: a run that is due while the
previous one is still going is skipped (and counted in
`infersight_scheduler_job_skipped_total`), and runs missed while the process was busy
collapse into one, so a slow job never piles up. Leader-only jobs (rules, drift, outbox,
retention) first ask the `LeaderLock`; on a follower they return at once. A job's
exception is logged and counted, never fatal to the scheduler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from .leader import AlwaysLeader, LeaderLock
from .metrics import ServiceMetrics

__all__ = ["JobSpec", "ServiceScheduler"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    name: str
    interval_s: float
    leader_only: bool


class ServiceScheduler:
    def __init__(
        self, metrics: ServiceMetrics, leader: LeaderLock | None = None, *, threads: int = 6
    ) -> None:
        self.metrics = metrics
        self.leader = leader or AlwaysLeader()
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(threads)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        self._scheduler.add_listener(self._on_max_instances, EVENT_JOB_MAX_INSTANCES)
        self.jobs: dict[str, JobSpec] = {}

    def add(
        self, name: str, fn: Callable[[], object], interval_s: float, *, leader_only: bool = False,
        run_now: bool = False,
    ) -> None:  # fmt: skip
        if name in self.jobs:
            raise ValueError(f"job {name!r} is already scheduled")
        self.jobs[name] = JobSpec(name, interval_s, leader_only)
        kwargs = {"next_run_time": _now()} if run_now else {}
        self._scheduler.add_job(
            self._wrap(name, fn, leader_only),
            "interval",
            seconds=interval_s,
            id=name,
            name=name,
            max_instances=1,
            coalesce=True,
            **kwargs,
        )

    def run_now(self, name: str) -> None:
        """Schedule `name` to run at once (still never twice at a time)."""
        self._scheduler.modify_job(name, next_run_time=_now())

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self, wait: bool = True) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)
        self.leader.release()

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def _wrap(self, name: str, fn: Callable[[], object], leader_only: bool) -> Callable[[], None]:
        def run() -> None:
            if leader_only:
                leading = self.leader.is_leader()
                self.metrics.leader.set(1 if leading else 0)
                if not leading:
                    self.metrics.job_runs.labels(name, "follower").inc()
                    return
            t0 = time.perf_counter()
            try:
                fn()
            except Exception:
                log.exception("job %s failed", name)
                self.metrics.job_runs.labels(name, "error").inc()
            else:
                self.metrics.job_runs.labels(name, "ok").inc()
            finally:
                self.metrics.job_duration.labels(name).observe(time.perf_counter() - t0)

        return run

    def _on_max_instances(self, event: JobExecutionEvent) -> None:
        self.metrics.job_skipped.labels(event.job_id).inc()


def _now() -> object:
    import datetime as dt

    return dt.datetime.now(dt.UTC)
