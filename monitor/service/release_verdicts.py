"""Release verdicts: where each (candidate, baseline) comparison stands, kept current by the pairs.

A progressive-delivery controller (Argo Rollouts' web or Job metric provider, Flagger's
webhooks, a KServe pipeline) asks one question between its steps: may the candidate go on?
`ReleaseVerdicts` answers it from state the paired analysis leaves behind: it listens to
`PairedEvidence` (alerts/release/paired_checks.py), and every scored pair replaces the comparison's
figures and its judgement here, so a question is a dictionary read under a lock, however
often, and however many controllers, ask. The analysis is sequential and always valid
(mixture SPRTs), so reading it at any moment, as often as a controller polls, costs nothing
in error rate.

The judgement (`judge`), in this order:
- `inconclusive` while fewer than `min_pairs` pairs compared the two versions (the caller's
  least evidence for any decision; never below the paired checks' own minimum);
- `fail` when any check regressed (its figure and always-valid p-value in `reason`);
- `inconclusive` while a measured check has fewer than `min_pairs` pairs of its own (the
  relevance and similarity checks count only pairs whose answers were embedded);
- `inconclusive` while a check the policy requires to be decided (`decide`: divergence, the
  one that sees a quiet loss of quality) has neither regressed nor cleared (its always-valid
  interval wholly on the good side of its line), up to `max_pairs` pairs, as a canary step is
  held: a few noisy pairs past `min_pairs` are not evidence that a release is good;
- `pass` otherwise: every measured check had `min_pairs` pairs, none regressed, and each
  decisive one cleared or ran out of pairs (the reason says which). A check no
  pair of this source can measure (step times, which a shadow upstream's answers do not
  carry; relevance and similarity without the drift module's embedder) is named as not
  checked, never counted as passed.

A version is known when the service has seen it (it answered, it was configured, or pairs
name it); `lookup` raises `UnknownRelease` otherwise. A baseline is only refused as unknown
once pairs of the candidate against other baselines exist (a typo is then visible), not
before the first pair.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .errors import UnknownRelease

__all__ = ["CheckVerdict", "ReleaseVerdict", "ReleaseVerdicts", "VerdictCollector", "judge"]

Outcome = Literal["pass", "fail", "inconclusive"]
_NOT_MEASURED = {
    "step_time": "the pairs carry no decode step times",
    "relevance": "no answers embedded (the drift module's embedder scores them)",
    "similarity": "no answers embedded (the drift module's embedder scores them)",
    "divergence": "the pairs carry no log-probabilities (proxy pairs, or not read by the other version)",
}


@dataclass(frozen=True)
class CheckVerdict:
    """One paired check as a controller reads it: `figure` in the check's own unit (mean
    relevance difference, mean similarity, mean length or step ratio, share of finish
    reasons that differ), its always-valid `p`, `passed` (None: not decided yet)."""

    name: str
    pairs: int
    figure: float | None
    p: float
    passed: bool | None
    text: str  # the figures in words (PairedCheck.describe)

    def to_json(self) -> dict[str, Any]:
        figure = None if self.figure is None else round(self.figure, 6)
        return {"figure": figure, "p": round(self.p, 6), "passed": self.passed, "pairs": self.pairs,
                "text": self.text}  # fmt: skip


@dataclass(frozen=True)
class ReleaseVerdict:
    candidate: str
    baseline: str
    verdict: Outcome
    pairs: int
    min_pairs: int
    checks: tuple[CheckVerdict, ...]
    reason: str


def _figure(check: Any) -> float | None:
    if check.mean is None:
        return None
    if check.name in ("output_length", "step_time"):  # kept as a log ratio: shown as the ratio
        return math.exp(check.mean)
    return float(check.mean)


def judge(
    candidate: str, baseline: str, pairs: int, checks: tuple[Any, ...], min_pairs: int,
    decide: tuple[str, ...] = (), max_pairs: int = 0,
) -> ReleaseVerdict:  # fmt: skip
    """The verdict of `pairs` pairs whose checks stand at `checks` (`PairedCheck`s), as the
    module's docstring orders it; `decide` and `max_pairs` as the paired policy's."""
    measured = [c for c in checks if c.pairs > 0]

    def passed(c: Any) -> bool | None:
        if c.regressed:
            return False
        if c.name in decide:  # cleared, or out of pairs while undecided
            return True if c.cleared or pairs >= max_pairs else None
        return True if c.pairs >= min_pairs else None

    verdicts = tuple(
        CheckVerdict(c.name, c.pairs, _figure(c), c.p_value, passed(c), c.describe()) for c in measured
    )
    failed = [c for c in measured if c.regressed]
    unchecked = [c.name for c in checks if c.pairs == 0]
    if pairs < min_pairs:
        outcome: Outcome = "inconclusive"
        reason = f"{pairs} of {min_pairs} pairs so far"
        if failed:
            reason += f" (already regressed: {'; '.join(c.describe() for c in failed)})"
    elif failed:
        outcome, reason = "fail", "; ".join(c.describe() for c in failed) + f" ({pairs} pairs)"
    elif short := [c for c in measured if c.pairs < min_pairs]:
        outcome = "inconclusive"
        reason = "; ".join(f"{c.name}: {c.pairs} of {min_pairs} pairs scored" for c in short)
    elif open_ := [c for c in measured if c.name in decide and not c.cleared and pairs < max_pairs]:
        outcome = "inconclusive"
        reason = "; ".join(f"{c.name} not decided after {c.pairs} pairs (mean {c.mean:.3g} against "
                           f"{c.null:g}, at most {max_pairs} pairs asked for)" for c in open_)  # fmt: skip
    else:
        outcome = "pass"
        reason = f"{pairs} pairs, no regression: " + "; ".join(c.describe() for c in measured)
        if undecided := [c.name for c in measured if c.name in decide and not c.cleared]:
            reason += f"; {', '.join(undecided)} still undecided after {pairs} pairs (the most asked for)"
    if unchecked and pairs:
        reason += "; not checked: " + ", ".join(
            f"{name} ({_NOT_MEASURED.get(name, 'no pairs measure it')})" for name in unchecked
        )
    return ReleaseVerdict(candidate, baseline, outcome, pairs, min_pairs, verdicts, reason)


class ReleaseVerdicts:
    """Every comparison's latest figures and verdict (at the default `min_pairs`), replaced by
    each pair (`update`, a `PairedEvidence` listener). `known(version)`: whether the service
    has seen the version outside pairs (it answered as it, or it is configured). `source`:
    where the pairs come from, or why none do. Thread-safe."""

    def __init__(
        self, *, min_pairs: int, source: str, enabled: bool = True,
        known: Callable[[str], bool] = lambda version: False,
        decide: tuple[str, ...] = (), max_pairs: int = 0,
    ) -> None:  # fmt: skip
        self.min_pairs = min_pairs  # the paired checks' own minimum: the least a caller may ask for
        # the checks that must be decided before a pass, and the pairs after which they need not
        # be: the paired policy's, so that a controller's step is held as a canary's is
        self.decide, self.max_pairs = decide, max_pairs
        self.source = source
        self.enabled = enabled
        self.known = known
        self._lock = threading.Lock()
        self._by: dict[tuple[str, str], tuple[int, tuple[Any, ...], ReleaseVerdict]] = {}

    def update(self, candidate: str, baseline: str, pairs: int, checks: tuple[Any, ...]) -> None:
        """The comparison's figures now (0 pairs: forgotten, as a new analysis starts afresh)."""
        verdict = judge(candidate, baseline, pairs, checks, self.min_pairs, self.decide, self.max_pairs)
        with self._lock:
            self._by[(candidate, baseline)] = (pairs, checks, verdict)

    def _seen(self, version: str) -> bool:
        return any(version in key for key in self._by) or self.known(version)

    def lookup(self, candidate: str, baseline: str, min_pairs: int | None = None) -> ReleaseVerdict:
        """The verdict now; `min_pairs` None: the default. Raises UnknownRelease naming the field."""
        with self._lock:
            kept = self._by.get((candidate, baseline))
            if kept is None:
                if not self._seen(candidate):
                    raise UnknownRelease("candidate", f"no version {candidate!r} has been seen here")
                others = sorted({b for c, b in self._by if c == candidate})
                if others and not self._seen(baseline):
                    raise UnknownRelease("baseline", f"no version {baseline!r} has been seen here; pairs of "
                                         f"{candidate} compare it with {', '.join(others)}")  # fmt: skip
                kept = (0, (), judge(candidate, baseline, 0, (), self.min_pairs, self.decide, self.max_pairs))
        pairs, checks, verdict = kept
        if min_pairs is None or min_pairs == self.min_pairs:
            return verdict
        return judge(candidate, baseline, pairs, checks, min_pairs, self.decide, max(self.max_pairs, min_pairs))

    def snapshot(self) -> list[ReleaseVerdict]:
        """Every comparison with pairs, at the default `min_pairs`."""
        with self._lock:
            return [verdict for pairs, _, verdict in self._by.values() if pairs > 0]


class VerdictCollector(Collector):
    """`infersight_release_check_passed{candidate,baseline,check}`: 1 passed, 0 regressed, -1 not
    decided yet (so `min()` over a comparison's checks is 1 only when all passed), and
    `infersight_release_pairs{candidate,baseline}`, at the default `min_pairs`."""

    def __init__(self, verdicts: ReleaseVerdicts) -> None:
        self.verdicts = verdicts

    def collect(self) -> Iterator[Any]:
        passed = GaugeMetricFamily(
            "infersight_release_check_passed",
            "Paired release check of candidate against baseline: 1 passed, 0 regressed, -1 not decided yet",
            labels=["candidate", "baseline", "check"],
        )
        pairs = GaugeMetricFamily(
            "infersight_release_pairs", "Pairs of candidate and baseline answering the same request",
            labels=["candidate", "baseline"],
        )  # fmt: skip
        for v in self.verdicts.snapshot():
            pairs.add_metric([v.candidate, v.baseline], float(v.pairs))
            for c in v.checks:
                passed.add_metric(
                    [v.candidate, v.baseline, c.name], -1.0 if c.passed is None else float(c.passed)
                )
        yield passed
        yield pairs
