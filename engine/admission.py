"""Admission control: a bounded queue per path and priority, and a limit on predicted wait.

Without a bound a flood of long requests queues without end: the request behind them waits
minutes and is never told. At submit, the runtime asks `Admission.check` about the queue the
request would join (the serving replica's, the canary's or, with SLA routing, the fast
path's: each path is bounded on its own, so a flood of long prompts on the standard path
leaves the fast path's queue free). Counted are the requests that would be served before
this one: those of its queue with at least its priority. The request is refused
(`QueueFull`, the service's 429 + Retry-After) when

- `max_queue` of them are already waiting, or
- its predicted wait is over `max_queue_wait_s`: the requests ahead that do not fit the
  replica's free slots, served `cap` at a time, each batch taking the replica's measured
  service time (step_times.py; no prediction, so no refusal, before it has served one), or
- its user is over its fair share of the queue (with `max_queue`): `max_queue` split evenly
  between the other users waiting and one more, so that a user arriving behind a burst still
  finds room. First come, first served would let one tenant's burst (many connections, as
  users the canary routing sends to one arm) fill a queue and starve everyone behind it; so
  the tenant over its share is refused first, as the Virtual Token Counter (Sheng et al.,
  OSDI 2024) serves the client with the least service first. A user alone may hold half the
  queue; requests without a user (None) are nobody's and are bounded by `max_queue` only.

A refusal costs a lock and a count: nothing is tokenized twice and the model sees nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import InvalidRequest, QueueFull

if TYPE_CHECKING:
    from .replica import PendingQueue, Replica

__all__ = ["Admission", "AdmissionLimits", "predicted_wait_s"]


@dataclass(frozen=True)
class AdmissionLimits:
    """`max_queue`: requests that may wait ahead of a new one in its queue (None: no bound);
    `max_queue_wait_s`: the longest predicted wait admitted (None: no bound)."""

    max_queue: int | None = None
    max_queue_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_queue is not None and self.max_queue < 1:
            raise InvalidRequest(f"max_queue must be >= 1 or None, got {self.max_queue}")
        if self.max_queue_wait_s is not None and not self.max_queue_wait_s > 0:
            raise InvalidRequest(f"max_queue_wait_s must be > 0 or None, got {self.max_queue_wait_s}")


def predicted_wait_s(ahead: int, replica: Replica) -> float | None:
    """Seconds a request waits behind `ahead` queued ones before `replica` admits it: none
    while a slot is free for it, else one measured service time per batch of `cap` ahead
    of it that does not fit (None: the replica has not finished a request yet)."""
    cap = max(1, replica.cap)
    free = max(0, cap - len(replica.running))
    if ahead < free:
        return 0.0
    service = replica.step_times.service_s
    if service is None:
        return None
    return math.ceil((ahead - free + 1) / cap) * service


def _share(queue: PendingQueue, user: str, max_queue: int) -> tuple[int, int]:
    """(`user`'s requests waiting in `queue`, its fair share: `max_queue` split between the
    other users waiting and one more, at least 1)."""
    mine, others = queue.waiting_of(user)
    return mine, max(1, max_queue // (others + 2))


class Admission:
    """The runtime's admission check (`runtime.admission`); `refused` counts refusals per path."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits if limits is not None else AdmissionLimits()
        self.refused: dict[str, int] = {}
        self.refused_over_share: dict[str, int] = {}  # of those, users over their fair share

    def check(
        self, queue: PendingQueue, replica: Replica, *, priority: int, path: str, user: str | None = None
    ) -> None:
        """Raise QueueFull when a request of `priority` from `user` may not join `queue` (served
        by `replica`)."""
        limits = self.limits
        if limits.max_queue is None and limits.max_queue_wait_s is None:
            return
        ahead = queue.count_at_least(priority)
        wait = predicted_wait_s(ahead, replica)
        service = replica.step_times.service_s or 1.0
        mine, share = (
            (0, 1) if user is None or limits.max_queue is None else _share(queue, user, limits.max_queue)
        )
        if limits.max_queue is not None and ahead >= limits.max_queue:
            reason = f"{ahead} requests are waiting on the {path} path (max_queue={limits.max_queue})"
        elif mine >= share:
            reason = (
                f"user {user!r} has {mine} requests waiting on the {path} path, its fair share of "
                f"max_queue={limits.max_queue}"
            )
        elif limits.max_queue_wait_s is not None and wait is not None and wait > limits.max_queue_wait_s:
            reason = (
                f"the predicted wait on the {path} path is {wait:.1f} s "
                f"(max_queue_wait_s={limits.max_queue_wait_s:g})"
            )
        else:
            return
        self.refused[path] = self.refused.get(path, 0) + 1
        if mine >= share:
            self.refused_over_share[path] = self.refused_over_share.get(path, 0) + 1
        retry = max(1.0, service)  # a batch of `cap` leaves the queue about every service time
        raise QueueFull(f"overloaded: {reason}; retry later", path=path, waiting=ahead, retry_after_s=retry)
