"""Retry policy: exponential backoff with full jitter, honouring `Retry-After`."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 1.0
    cap_s: float = 300.0
    max_attempts: int = 15  # then the notification is a dead letter
    max_age_s: float = 86_400.0  # or when it is older than this
    max_retry_after_s: float = 3_600.0  # a receiver's Retry-After is honoured up to this
    lease_s: float = 60.0  # a claimed row is another dispatcher's after this (crash recovery)

    def delay(self, attempts: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds before the next attempt after `attempts` failed ones: uniform in
        [0, min(cap, base * 2**(attempts-1))] (full jitter), but never sooner than Retry-After."""
        ceiling = min(self.cap_s, self.base_s * 2 ** max(0, attempts - 1))
        jittered = rng.uniform(0.0, ceiling)
        if retry_after is not None:
            return max(jittered, min(retry_after, self.max_retry_after_s))
        return jittered
