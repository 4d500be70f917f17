"""Paired release checks: the candidate and the baseline version answering the SAME requests.

The runtime answers a share of live requests with both versions (engine/runtime_shadow.py:
same prompt, token budget, sampling parameters and seed; only the live answer reaches the
client). Each pair is one observation of the difference the release makes, and nothing a
client chooses (its parameters, its prompts, when it asks or hangs up) can differ between
the two sides of a pair, so a client cannot make a good release look bad.

Six sequential checks per pair, each a one-sample mixture SPRT (always valid, like the
canary's: sequential.py) on a per-pair figure:
- `relevance`: candidate's relevance to the prompt minus the baseline's (a drop regresses);
- `similarity`: cosine between the two answers' embeddings, against `min_similarity` (answers
  less alike than that on average regress: another topic, another language, garbage);
- `output_length`: log((candidate tokens + 1) / (baseline tokens + 1)), either direction;
- `finish_agreement`: share of pairs whose finish reasons differ, against
  `max_finish_disagreement` (one stops where the other runs to the budget);
- `step_time`: log(candidate's decode step / baseline's) at the same batch size, both timed
  by the runtime in the same seconds (engine/runtime_shadow.py), against log(`max_step_ratio`):
  the latency check of a pair, which no load on the machine and no client can tilt, since
  both versions step under the same load (proxy pairs carry no step times: not checked);
- `divergence`: how much worse each version predicts the other's answers, in nats per token:
  0.5 * [(c_own - c_under_b) / n_c + (b_own - b_under_c) / n_b], where c_own is the sum of the
  log-probabilities of the candidate's answer (n_c tokens) under the candidate as it was
  sampled and c_under_b the same answer read by the baseline (and so for the baseline's
  answer; an answer of 0 tokens is left out of the mean). With answers sampled at temperature
  1 this estimates the symmetric KL divergence per token between the two versions on the live
  traffic: one number per pair of low variance, where two sampled answers' embeddings differ
  by chance even when the versions are equal. One-sided against `max_divergence` (0.05 nats per
  token: the candidate reads the baseline's answers worse by a perplexity ratio of at most
  exp(0.05) = 1.05). The runtime computes the cross sums with two teacher-forced forward
  passes per pair, when no live request waits or once the pair has waited a second
  (engine/runtime_shadow.py); pairs without
  them (proxy pairs, or a pair the runtime had no time to score) leave the check waiting.
`relevance` and `similarity` need the answers embedded (the monitor scores them later);
`output_length`, `finish_agreement`, `step_time` and `divergence` are known when the pair completes.
The checks share the caller's error budget (`alpha`, split Bonferroni-style over the checks).

A verdict explains itself: `PairedCheck.describe()` says how many pairs went which way
("relevance fell in 17 of 20 pairs, mean -0.41").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .sequential import Evidence, Moments, msprt_lambda, msprt_radius

__all__ = [
    "PAIRED_CHECKS",
    "SIMILARITY_MODES",
    "PairOutcome",
    "PairPolicy",
    "PairedAnalysis",
    "PairedCheck",
    "PairedEvidence",
    "msprt_lambda",
]

PAIRED_CHECKS = ("relevance", "similarity", "output_length", "finish_agreement", "step_time", "divergence")
SIMILARITY_MODES = ("without_divergence", "always")


@dataclass(frozen=True)
class PairPolicy:
    """What pairs must pass. `min_pairs` before any check may decide."""

    alpha: float = 0.01  # the whole budget of the paired checks (each gets alpha / 6)
    min_pairs: int = 10
    tau_relevance: float = 0.1  # prior sd of the mean relevance difference
    min_similarity: float = 0.6  # mean cosine between the two answers below this: a regression
    tau_similarity: float = 0.1
    tau_length: float = 0.3  # prior sd of the mean log length ratio
    max_finish_disagreement: float = 0.25
    tau_finish: float = 0.1
    max_step_ratio: float = 1.5  # the candidate's decode step over this times the baseline's regresses
    tau_step: float = 0.3  # prior sd of the mean log step ratio
    # nats per token each version reads the other's answers worse, on average, above which the
    # candidate regresses: 0.05 nats is a perplexity ratio of exp(0.05)
    max_divergence: float = 0.05
    # prior sd of the mean divergence: the releases worth stopping read each other's answers
    # 0.1-0.5 nats/token worse, and a mixture much narrower than the effects it should find
    # needs many more pairs to find them
    tau_divergence: float = 0.2
    # the checks a canary step must have DECIDED before it is left: regressed, or cleared (the
    # always-valid interval of the mean wholly on the good side of the null) -- not merely
    # undecided after `min_pairs`, which lets a quietly bad release through on a few noisy
    # pairs; after `max_pairs` pairs an undecided check no longer holds the step (the verdict
    # says so)
    decide: tuple[str, ...] = ("divergence",)
    max_pairs: int = 100
    # the smallest per-pair sd a check assumes: a few pairs that all moved by the same tiny
    # amount (a shared rounding) are not certainty of a difference (see canary.py's pooled note)
    min_sd: float = 0.02
    # when `similarity` may fail a release (SIMILARITY_MODES): "without_divergence": only on
    # pairs that carry no divergence (a proxy's), while on the runtime's pairs it is reported
    # and divergence decides; or "always". Both sides of a runtime pair sample with one seed, so
    # two faithful versions give the same tokens until their distributions first part, and two
    # unrelated continuations after: the mean similarity of sampled answers is then a noisy
    # reading of the distance that divergence measures directly, with a line of its own that
    # a faithful fp8 build falls under (benchmarks/pair_similarity.py)
    similarity_decides: str = "without_divergence"

    def __post_init__(self) -> None:
        if self.similarity_decides not in SIMILARITY_MODES:
            raise ValueError(f"similarity_decides must be one of {', '.join(SIMILARITY_MODES)}, "
                             f"not {self.similarity_decides!r}")  # fmt: skip


@dataclass(frozen=True)
class PairOutcome:
    """One scored pair: the candidate's and the baseline's answer to the same request.
    Relevances and similarity are None until the answers are embedded."""

    candidate: str
    baseline: str
    candidate_tokens: int
    baseline_tokens: int
    candidate_finish: str
    baseline_finish: str
    candidate_relevance: float | None = None
    baseline_relevance: float | None = None
    similarity: float | None = None
    candidate_step_s: float | None = None  # decode step seconds, both at one batch size, timed together
    baseline_step_s: float | None = None
    # sums of log-probabilities (nats, temperature 1) over an answer's tokens: each answer under
    # its own version as sampled, and read by the other version (engine's PairCompleted)
    candidate_logprob: float | None = None
    baseline_logprob: float | None = None
    candidate_under_baseline: float | None = None
    baseline_under_candidate: float | None = None

    def divergence(self) -> float | None:
        """Nats per token each version reads the other's answer worse, averaged over the two
        answers (one of 0 tokens left out); None without the four sums or with no tokens."""
        sides = ((self.candidate_logprob, self.candidate_under_baseline, self.candidate_tokens),
                 (self.baseline_logprob, self.baseline_under_candidate, self.baseline_tokens))  # fmt: skip
        if any(own is None or cross is None for own, cross, _ in sides):
            return None
        per_token = [(own - cross) / n for own, cross, n in sides if n > 0]  # type: ignore[operator]
        return sum(per_token) / len(per_token) if per_token else None


@dataclass(frozen=True)
class PairedCheck:
    """One paired check now: pairs seen, the mean per-pair figure, how many pairs fell
    below and rose above the check's null (`null`: 0 for a difference), the always-valid
    p-value."""

    name: str
    pairs: int
    mean: float | None
    below: int
    above: int
    null: float
    p_value: float
    regressed: bool
    cleared: bool = False  # shown not to regress at the check's alpha (its interval on the good side)
    reported_only: bool = False  # measured, not deciding (`PairPolicy.similarity_decides`)

    def describe(self) -> str:
        """The figures in words: what a page, the deploy history and the alert say."""
        p = f"always-valid p={self.p_value:.3g}"
        if self.mean is None:
            return f"{self.name}: no pairs yet"
        n, low, high = self.pairs, self.below, self.above
        if self.name == "relevance":
            return f"relevance fell in {low} of {n} pairs (rose in {high}), mean {self.mean:+.2f}, {p}"
        if self.name == "similarity":
            return (
                f"the two answers less alike than {self.null:g} in {low} of {n} pairs, "
                f"mean similarity {self.mean:.2f}, {p}"
                + (" (reported only: divergence decides on these pairs)" if self.reported_only else "")
            )
        if self.name == "output_length":
            return (
                f"output shorter in {low} and longer in {high} of {n} pairs, "
                f"mean length ratio {math.exp(self.mean):.2f}, {p}"
            )
        if self.name == "divergence":
            return (
                f"each version read the other's answers {self.mean:.2f} nats/token worse "
                f"(about {math.expm1(self.mean):.0%} in perplexity) on average, more than "
                f"{self.null:g} in {high} of {n} pairs, {p}"
            )
        if self.name == "step_time":
            return (
                f"decode steps slower than {math.exp(self.null):g}x in {high} of {n} pairs, "
                f"mean step ratio {math.exp(self.mean):.2f}, {p}"
            )
        return f"finish reasons differ in {high} of {n} pairs ({self.mean:.0%}), {p}"


@dataclass
class _OneSample:
    """A sequential one-sample test of a per-pair figure's mean against `null`."""

    name: str
    evidence: Evidence
    null: float = 0.0
    bernoulli: bool = False  # a 0/1 figure: the variance under the null, not the sample's
    moments: Moments = field(default_factory=Moments)
    below: int = 0
    above: int = 0
    tie: float = 1e-6  # a per-pair figure this close to the null counts neither way
    cleared: bool = False  # once shown, at alpha, not to regress (stays so: a stopping rule)

    def add(self, x: float, *, alpha: float, min_n: int, min_sd: float) -> None:
        m = self.moments
        m.add(x)
        self.below += x < self.null - self.tie
        self.above += x > self.null + self.tie
        if m.n < min_n:
            return
        if self.bernoulli:
            variance = self.null * (1.0 - self.null) / m.n
        else:
            variance = max(m.var, min_sd * min_sd) / m.n
        self.evidence.update(m.mean - self.null, variance, alpha=alpha)
        direction = self.evidence.direction
        if not self.cleared and not self.bernoulli and direction != "either":
            r = msprt_radius(variance, self.evidence.tau, alpha)
            good = m.mean + r < self.null if direction == "higher_is_worse" else m.mean - r > self.null
            self.cleared = good and not self.evidence.regressed

    @property
    def regressed(self) -> bool:
        return self.evidence.regressed

    def state(self) -> PairedCheck:
        m = self.moments
        return PairedCheck(self.name, m.n, m.mean if m.n else None, self.below, self.above, self.null,
                           self.evidence.p_value, self.evidence.regressed, self.cleared)  # fmt: skip


class PairedAnalysis:
    """The running paired comparison of one candidate with one baseline. Not thread-safe:
    its owner feeds it under a lock (`PairedEvidence`, the canary controller)."""

    def __init__(self, policy: PairPolicy | None = None, *, alpha: float | None = None) -> None:
        """`alpha`: this analysis' share of the caller's error budget (default the policy's)."""
        self.policy = p = policy or PairPolicy()
        self.alpha = (alpha if alpha is not None else p.alpha) / len(PAIRED_CHECKS)
        self._checks = {
            "relevance": _OneSample("relevance", Evidence("lower_is_worse", p.tau_relevance)),
            "similarity": _OneSample("similarity", Evidence("lower_is_worse", p.tau_similarity),
                                     null=p.min_similarity),
            "output_length": _OneSample("output_length", Evidence("either", p.tau_length), tie=0.05),
            "finish_agreement": _OneSample("finish_agreement", Evidence("higher_is_worse", p.tau_finish),
                                           null=p.max_finish_disagreement, bernoulli=True),
            "step_time": _OneSample("step_time", Evidence("higher_is_worse", p.tau_step),
                                    null=math.log(p.max_step_ratio)),
            "divergence": _OneSample("divergence", Evidence("higher_is_worse", p.tau_divergence),
                                     null=p.max_divergence),
        }  # fmt: skip
        self.pairs = 0
        self.first_regression: PairedCheck | None = None

    def observe(self, pair: PairOutcome) -> None:
        """One pair: its lengths and finish reasons now, its scores when it has them."""
        self.pairs += 1
        ratio = math.log((pair.candidate_tokens + 1) / (pair.baseline_tokens + 1))
        self._add("output_length", ratio)
        self._add("finish_agreement", float(pair.candidate_finish != pair.baseline_finish))
        if pair.candidate_relevance is not None and pair.baseline_relevance is not None:
            self._add("relevance", pair.candidate_relevance - pair.baseline_relevance)
        if pair.similarity is not None:
            self._add("similarity", pair.similarity)
        c_step, b_step = pair.candidate_step_s, pair.baseline_step_s
        if c_step is not None and b_step is not None and c_step > 0.0 and b_step > 0.0:
            self._add("step_time", math.log(c_step / b_step))
        divergence = pair.divergence()
        if divergence is not None:
            self._add("divergence", divergence)

    def _add(self, name: str, x: float) -> None:
        check = self._checks[name]
        was = self._state(check).regressed
        check.add(x, alpha=self.alpha, min_n=self.policy.min_pairs, min_sd=self.policy.min_sd)
        if self.first_regression is None:
            state = self._state(check)
            if state.regressed and not was:
                self.first_regression = state

    def _state(self, check: _OneSample) -> PairedCheck:
        state = check.state()
        if (
            check.name == "similarity"
            and self.policy.similarity_decides == "without_divergence"
            and self._checks["divergence"].moments.n > 0
        ):
            return replace(state, regressed=False, reported_only=True)
        return state

    def checks(self) -> tuple[PairedCheck, ...]:
        return tuple(self._state(c) for c in self._checks.values())

    def regressions(self) -> tuple[PairedCheck, ...]:
        return tuple(c for c in self.checks() if c.regressed)

    def summary(self) -> str:
        """Every check's figures, for a verdict that passed."""
        return f"{self.pairs} pairs: " + "; ".join(c.describe() for c in self.checks())


class PairedEvidence:
    """Pairs per (candidate, baseline), fed by the monitor as they are scored and read by the
    post-deploy analysis (thread-safe). `enabled` False (proxy mode without a shadow
    upstream): no pairs will come, and a verdict says so (`off_reason`)."""

    def __init__(
        self, policy: PairPolicy | None = None, *, enabled: bool = True, off_reason: str = "",
        step_times: bool = False,
    ) -> None:  # fmt: skip
        """`step_times`: the pairs carry both versions' decode step times (the embedded
        runtime's do, a shadow upstream's do not), so latency is judged on them."""
        self.policy = policy or PairPolicy()
        self.enabled = enabled
        self.step_times = step_times
        self.off_reason = off_reason or "paired checks off: no second version answers shadows"
        self._lock = threading.Lock()
        self._by: dict[tuple[str, str], PairedAnalysis] = {}
        # called under the lock with (candidate, baseline, pairs, each check's state) whenever a
        # comparison changes (0 pairs: forgotten), so a reader keeps its own copy current
        self.listeners: list[Callable[[str, str, int, tuple[PairedCheck, ...]], None]] = []

    def observe(self, pair: PairOutcome) -> None:
        key = (pair.candidate, pair.baseline)
        with self._lock:
            analysis = self._by.get(key)
            if analysis is None:
                analysis = self._by[key] = PairedAnalysis(self.policy)
            analysis.observe(pair)
            if self.listeners:
                checks = analysis.checks()
                for listener in self.listeners:
                    listener(*key, analysis.pairs, checks)

    def checks(self, candidate: str, baseline: str) -> tuple[int, tuple[PairedCheck, ...]]:
        """(pairs, each check's state) of `candidate` against `baseline` ((0, ()) when none)."""
        with self._lock:
            analysis = self._by.get((candidate, baseline))
            return (0, ()) if analysis is None else (analysis.pairs, analysis.checks())

    def comparisons(self) -> list[tuple[str, str, int, tuple[PairedCheck, ...]]]:
        """(candidate, baseline, pairs, each check's state) of every comparison with pairs."""
        with self._lock:
            return [(c, b, a.pairs, a.checks()) for (c, b), a in self._by.items()]

    def forget(self, candidate: str, baseline: str) -> None:
        with self._lock:
            self._by.pop((candidate, baseline), None)
            for listener in self.listeners:
                listener(candidate, baseline, 0, ())
