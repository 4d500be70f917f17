"""Unpaired comparisons of requests of the same shape, combined across shapes.

A check that compares two groups of different requests (the canary's users against the
stable's) reads any difference in what the groups asked as a difference of the versions: a
client asking the canary for long answers and the stable version for short ones makes the
canary look slow. Latency is therefore compared only within a stratum of requests of the
same shape (`shape`: the output-length and prompt-length buckets, powers of two) and the
strata are combined with Cochran-Mantel-Haenszel weights, so a stratum only one arm asked
for carries no weight at all.

`StratifiedExceedance` is the canary's latency check: in each stratum, the share of
requests slower than the stable version's `quantile` there (the threshold fixed by the
stable's first `baseline` requests of that stratum), canary against stable; the combined
difference and its variance feed the same always-valid mixture SPRT as every other check
(`msprt_lambda`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .pairs import msprt_lambda

__all__ = ["StratifiedExceedance", "shape"]


def _bucket(n: int | None) -> int:
    return -1 if n is None else max(0, int(n)).bit_length()  # 0, 1, 2-3, 4-7, 8-15, ...


def shape(output_tokens: int | None, prompt_tokens: int | None) -> tuple[int, int]:
    """The stratum of a request: its output-length and prompt-length buckets (powers of two)."""
    return _bucket(output_tokens), _bucket(prompt_tokens)


@dataclass
class _Stratum:
    baseline: list[float] = field(default_factory=list)  # the stable's first latencies here
    pending: list[tuple[bool, float]] = field(default_factory=list)  # before the threshold
    threshold: float | None = None
    n: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    over: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})


class StratifiedExceedance:
    """Canary (True) against stable (False) on the share of slow requests, within shapes."""

    def __init__(self, *, quantile: float, baseline: int, tau: float, min_n: int) -> None:
        self.quantile = quantile
        self.baseline = baseline
        self.tau = tau
        self.min_n = min_n
        self._strata: dict[tuple[int, int], _Stratum] = {}
        self.max_lambda = 1.0
        self.regressed = False

    def add(self, canary: bool, latency_s: float, key: tuple[int, int], *, alpha: float) -> bool:
        """One request; True when this observation made the check regress."""
        s = self._strata.setdefault(key, _Stratum())
        if s.threshold is None:
            s.pending.append((canary, latency_s))
            if not canary:
                s.baseline.append(latency_s)
            if len(s.baseline) < self.baseline:
                return False
            ordered = sorted(s.baseline)
            k = min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)
            s.threshold = ordered[max(k, 0)]
            pending, s.pending = s.pending, []
        else:
            pending = [(canary, latency_s)]
        for arm, value in pending:
            s.n[arm] += 1
            s.over[arm] += value > s.threshold
        return self._update(alpha)

    def _update(self, alpha: float) -> bool:
        weights = total = var = 0.0
        n = {True: 0, False: 0}
        for s in self._strata.values():
            nc, ns = s.n[True], s.n[False]
            n[True] += nc
            n[False] += ns
            if nc == 0 or ns == 0:
                continue  # one arm only: says nothing about the versions
            w = nc * ns / (nc + ns)
            pc, ps = s.over[True] / nc, s.over[False] / ns
            p = (s.over[True] + s.over[False] + 1.0) / (nc + ns + 2.0)  # under "no difference", smoothed
            weights += w
            total += w * (pc - ps)
            var += w * w * p * (1 - p) * (1.0 / nc + 1.0 / ns)
        if weights == 0.0 or n[True] < self.min_n or n[False] < self.min_n:
            return False
        delta, variance = total / weights, var / (weights * weights)
        if delta <= 0:
            return False
        was = self.regressed
        self.max_lambda = max(self.max_lambda, msprt_lambda(delta, variance, self.tau))
        self.regressed = self.max_lambda >= 1.0 / alpha
        return self.regressed and not was

    def figures(self) -> tuple[float | None, float | None, int, int]:
        """(canary share slow, stable share slow, canary n, stable n), over the compared strata."""
        c = sum(s.over[True] for s in self._strata.values())
        nc = sum(s.n[True] for s in self._strata.values())
        st = sum(s.over[False] for s in self._strata.values())
        ns = sum(s.n[False] for s in self._strata.values())
        return (c / nc if nc else None, st / ns if ns else None, nc, ns)
