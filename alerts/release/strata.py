"""Unpaired comparisons of requests of the same shape, combined across shapes.

A check that compares two groups of different requests (the canary's users against the
stable's) reads any difference in what the groups asked as a difference of the versions: a
client asking the canary for long answers and the stable version for short ones makes the
canary look slow. Latency is therefore compared only within a stratum of requests of the
same shape (`shape`: the output-length, prompt-length and `max_tokens` buckets, powers of
two, and the stream flag, where the records say them) and the strata are combined with
Cochran-Mantel-Haenszel weights, so a stratum only one arm asked for carries no weight at all.

Server errors are compared the same way, within strata of what the request asked
(`request_shape`: its `max_tokens` bucket and stream flag; not its prompt length, which a
failure often lacks: the engine's failure events and a proxied error carry none): a client that moves its long or streamed requests (whose
base error rate is higher) to one arm, or changes `max_tokens` at the moment of a deploy,
then makes no difference. `StratifiedRate` is the canary's sequential form; `like_rates`
the post-deploy analysis' (the two versions' rates standardised to the same strata).

`StratifiedExceedance` is the canary's latency check: in each stratum, the share of
requests slower than the stable version's `quantile` there (the threshold fixed by the
stable's first `baseline` requests of that stratum), canary against stable; the combined
difference and its variance feed the same always-valid mixture SPRT as every other check
(sequential.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .sequential import Evidence

__all__ = ["StratifiedExceedance", "StratifiedRate", "like_rates", "request_shape", "shape"]

Key = tuple[int, ...]


def _bucket(n: int | None) -> int:
    return -1 if n is None else max(0, int(n)).bit_length()  # 0, 1, 2-3, 4-7, 8-15, ...


def _flag(value: bool | None) -> int:
    return -1 if value is None else int(value)


def shape(
    output_tokens: int | None,
    prompt_tokens: int | None,
    max_tokens: int | None = None,
    stream: bool | None = None,
) -> Key:
    """The stratum of a finished request: its output-length, prompt-length and `max_tokens`
    buckets (powers of two; -1 where unknown) and its stream flag."""
    return _bucket(output_tokens), _bucket(prompt_tokens), _bucket(max_tokens), _flag(stream)


def request_shape(max_tokens: int | None, stream: bool | None) -> Key:
    """The stratum of a request by what it asked, known whether it failed or not (the error
    rate's strata): its `max_tokens` bucket and stream flag."""
    return _bucket(max_tokens), _flag(stream)


def _combine(cells: list[tuple[int, int, int, int]]) -> tuple[float, float, float, float] | None:
    """Mantel-Haenszel combination of (events new, n new, events old, n old) per stratum ->
    (new rate, old rate, difference, its variance under "no difference"), over the strata
    both arms have (weights n_new n_old / (n_new + n_old)); None when no stratum has both."""
    weights = new = old = var = 0.0
    for e1, n1, e0, n0 in cells:
        if n1 == 0 or n0 == 0:
            continue  # one arm only: says nothing about the versions
        w = n1 * n0 / (n1 + n0)
        p = (e1 + e0 + 1.0) / (n1 + n0 + 2.0)  # under "no difference", smoothed
        weights += w
        new += w * e1 / n1
        old += w * e0 / n0
        var += w * w * p * (1 - p) * (1.0 / n1 + 1.0 / n0)
    if weights == 0.0:
        return None
    return new / weights, old / weights, (new - old) / weights, var / (weights * weights)


def like_rates(cells: Mapping[Any, tuple[int, int, int, int]]) -> tuple[float, float, int] | None:
    """(new rate, old rate, strata compared) standardised to the strata both versions have,
    from (events new, n new, events old, n old) per stratum; None when they share none."""
    combined = _combine(list(cells.values()))
    if combined is None:
        return None
    shared = sum(1 for e1, n1, e0, n0 in cells.values() if n1 and n0)
    return combined[0], combined[1], shared


class StratifiedRate:
    """Canary (True) against stable (False) on the share of requests with an event (a server
    error), within strata, as an always-valid test of "the canary's rate is higher"."""

    def __init__(self, name: str, *, tau: float, min_n: int) -> None:
        self.name = name
        self.tau = tau
        self.min_n = min_n
        self._cells: dict[Key, list[int]] = {}  # [events canary, n canary, events stable, n stable]
        self.n = {True: 0, False: 0}
        self.events = {True: 0, False: 0}
        self.evidence = Evidence("higher_is_worse", tau)

    def add(self, canary: bool, event: bool, key: Key, *, alpha: float) -> bool:
        """One request; True when this observation made the check regress."""
        cell = self._cells.setdefault(key, [0, 0, 0, 0])
        i = 0 if canary else 2
        cell[i] += event
        cell[i + 1] += 1
        self.n[canary] += 1
        self.events[canary] += event
        if self.n[True] < self.min_n or self.n[False] < self.min_n:
            return False
        combined = _combine([(c[0], c[1], c[2], c[3]) for c in self._cells.values()])
        if combined is None:
            return False
        was = self.evidence.regressed
        return self.evidence.update(combined[2], combined[3], alpha=alpha) and not was

    def figures(self) -> tuple[float | None, float | None, int, int]:
        """(canary rate, stable rate, canary n, stable n), unstratified (what was seen)."""
        nc, ns = self.n[True], self.n[False]
        return (self.events[True] / nc if nc else None, self.events[False] / ns if ns else None, nc, ns)


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
        self._strata: dict[Key, _Stratum] = {}
        self.evidence = Evidence("higher_is_worse", tau)

    def add(self, canary: bool, latency_s: float, key: Key, *, alpha: float) -> bool:
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
        strata = self._strata.values()
        if sum(s.n[True] for s in strata) < self.min_n or sum(s.n[False] for s in strata) < self.min_n:
            return False
        combined = _combine([(s.over[True], s.n[True], s.over[False], s.n[False]) for s in strata])
        if combined is None:
            return False
        was = self.evidence.regressed
        return self.evidence.update(combined[2], combined[3], alpha=alpha) and not was

    def figures(self) -> tuple[float | None, float | None, int, int]:
        """(canary share slow, stable share slow, canary n, stable n), over the compared strata."""
        c = sum(s.over[True] for s in self._strata.values())
        nc = sum(s.n[True] for s in self._strata.values())
        st = sum(s.over[False] for s in self._strata.values())
        ns = sum(s.n[False] for s in self._strata.values())
        return (c / nc if nc else None, st / ns if ns else None, nc, ns)
