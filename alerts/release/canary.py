"""Canary analysis: the candidate against the stable version over the same minutes.

Every finished request of either arm is fed to `CanaryAnalysis.observe` as it happens, and
each check updates its always-valid sequential test (the mSPRT of sequential.py) after
*every* observation: however often, and whenever, anyone looks, a canary that does not
differ passes a check's 1/alpha with probability at most alpha. Asking for the verdict reads
the state the observations left, so the result never depends on a polling period. The
verdict is the controller's to act on: a rollback raises its alert first (`on_decision`),
then the action runner ends the canary (`rollback`, the service's), one path for every
rollback (alerts/actions/runner.py).

Checks (a regression is a significant difference in the bad direction only):
- `server_errors`: share of requests that failed for a server-side reason (monitor/
  outcomes.py: client errors and cancellations are the caller's doing, requests shed or
  refused by admission control the service protecting itself; none is counted);
- `latency`: share of requests slower than the stable version's p90, the threshold fixed
  from the stable's first `latency_baseline` requests (exceedances, a two-proportion test),
  compared only between requests of the same shape (output- and prompt-length buckets),
  strata combined Mantel-Haenszel style (alerts/release/strata.py): a client asking one arm
  for longer answers does not make it look slow.
  Only requests that ran at some point while the other arm had one running are compared. The
  runtime runs both arms' forwards in turn every step: a canary request pays the stable's in
  nearly every step, a stable request the canary's only while one runs, so beside a slower
  stable version a faster canary looks the slower. `latency="own"` compares each request net
  of the other arm's forwards it waited on (engine RequestFinished `others_s`);
- `relevance`: mean relevance of answer to prompt (a drop is a regression);
- `output_drift`: how close each answer's embedding lies to what the stable version
  answers: the cosine to the mean (unit-norm) embedding of the stable's first
  `drift_baseline` scored answers, which fix that reference and are not tested. Canary
  answers that drift away (other topics, other language, degenerate text) score lower;
  a drop is a regression, as for relevance, on the same sampled answers;
- `output_length`: mean output length in tokens, either direction (every request has one,
  before any answer is scored).
Each check runs at alpha / 5 (Bonferroni), so a good canary is rolled back with
probability at most `alpha` over its whole life.

With pairs (the runtime answers a share of requests with both versions: engine/
runtime_shadow.py) the three quality checks above (relevance, output drift, output length)
are replaced by the paired checks of alerts/release/paired_checks.py on the same requests, which no
client can steer by what it asks of its arm; server errors and latency stay arm against arm,
and they all share alpha (a sixth each to server errors and latency, the rest split over
the paired checks).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from infersight.monitor.outcomes import engine_label, is_server_error
from infersight.monitor.records import StoredRequest

from .paired_checks import PairedAnalysis, PairOutcome, PairPolicy
from .sequential import Evidence, Moments, msprt_lambda
from .strata import StratifiedExceedance, StratifiedRate, request_shape, shape

__all__ = [
    "CANARY_ALERT",
    "LATENCY_MODES",
    "CanaryAnalysis",
    "CanaryController",
    "CanaryDecision",
    "CanaryPolicy",
    "CanaryRuntime",
    "CheckState",
    "StoredRequest",
    "Verdict",
    "msprt_lambda",
]

CANARY_ALERT = "CanaryRegression"
LATENCY_MODES = ("whole", "own")  # CanaryPolicy.latency


@dataclass(frozen=True)
class CanaryPolicy:
    """What a canary must pass. `steps` are traffic weights; a step is left for the next
    after `requests_per_step` canary requests at it with no significant regression."""

    steps: tuple[float, ...] = (0.1, 0.5, 1.0)
    requests_per_step: int = 200
    alpha: float = 0.01
    min_requests: int = 20  # per arm before any check may decide
    latency_quantile: float = 0.9
    latency_baseline: int = 50  # stable requests that fix the latency threshold
    latency: str = "whole"  # "whole": arrival to last token; "own": less the other arm's forwards
    tau_rate: float = 0.05  # prior sd of an error-rate / exceedance difference
    tau_relevance: float = 0.1  # prior sd of a mean relevance difference
    tau_length: float = 8.0  # prior sd of a mean output-length difference (tokens)
    drift_baseline: int = 20  # stable answers whose mean embedding is the output reference
    tau_similarity: float = 0.1  # prior sd of a mean difference in cosine to that reference


@dataclass(frozen=True)
class CheckState:
    """One check's figures now: each arm's estimate and count, the running maximum of the
    mixture likelihood ratio and the always-valid p-value 1 / max(1, that maximum)."""

    name: str
    canary: float | None
    stable: float | None
    canary_n: int
    stable_n: int
    max_lambda: float
    p_value: float
    regressed: bool

    def describe(self) -> str:
        c = "n/a" if self.canary is None else f"{self.canary:.4g}"
        s = "n/a" if self.stable is None else f"{self.stable:.4g}"
        return (
            f"{self.name}: canary {c} (n={self.canary_n}) vs stable {s} (n={self.stable_n}), "
            f"always-valid p={self.p_value:.3g}"
        )


@dataclass(frozen=True)
class Verdict:
    """`action` is "continue", "promote" (to `weight`) or "rollback"; `reason` names the
    deciding check and its figures; `checks` holds all of them."""

    action: Literal["continue", "promote", "rollback"]
    weight: float
    reason: str
    checks: tuple[CheckState, ...]


@dataclass
class _Check:
    """One arm-against-arm check: each arm's running moments and the evidence of a difference."""

    name: str
    evidence: Evidence
    arms: dict[bool, Moments] = field(default_factory=lambda: {True: Moments(), False: Moments()})

    def add(self, canary: bool, x: float, *, alpha: float, min_n: int, pooled: bool) -> None:
        self.arms[canary].add(x)
        c, s = self.arms[True], self.arms[False]
        if c.n < min_n or s.n < min_n:
            return
        if pooled:  # a proportion: the variance under "no difference", add-one smoothed
            p = (c.mean * c.n + s.mean * s.n + 1.0) / (c.n + s.n + 2.0)
            variance = p * (1 - p) * (1.0 / c.n + 1.0 / s.n)
        else:
            # a mean: the arms' pooled within-arm variance, as under "no difference" the two
            # share one distribution. A per-arm plug-in made a canary whose few answers all
            # had the same length (capped at max_tokens: variance 0) look certain of a
            # 0.4-token difference (a false rollback on the real runtime, docs/benchmarks/releases.md)
            pooled_var = ((c.n - 1) * c.var + (s.n - 1) * s.var) / max(1, c.n + s.n - 2)
            variance = pooled_var * (1.0 / c.n + 1.0 / s.n)
        self.evidence.update(c.mean - s.mean, variance, alpha=alpha)

    @property
    def regressed(self) -> bool:
        return self.evidence.regressed

    def state(self) -> CheckState:
        c, s, e = self.arms[True], self.arms[False], self.evidence
        return CheckState(
            self.name, c.mean if c.n else None, s.mean if s.n else None, c.n, s.n,
            e.max_lambda, e.p_value, e.regressed,
        )  # fmt: skip


class CanaryAnalysis:
    """The running comparison of one canary with the stable version. Not thread-safe:
    one owner feeds it (the controller holds a lock)."""

    def __init__(self, policy: CanaryPolicy | None = None, *, pairs: PairPolicy | None = None) -> None:
        """`pairs`: the versions also answer the same requests (engine/runtime_shadow.py): the
        quality checks are paired (alerts/release/paired_checks.py), not arm against arm, which
        clients could steer; server errors and latency stay unpaired."""
        self.policy = policy or CanaryPolicy()
        p = self.policy
        self._checks: dict[str, _Check] = {}
        # server errors: only requests of the same shape (max_tokens bucket, stream) are compared
        self._errors = StratifiedRate("server_errors", tau=p.tau_rate, min_n=p.min_requests)
        # latency: only requests of the same shape are compared (strata.py)
        self._latency = StratifiedExceedance(quantile=p.latency_quantile, baseline=p.latency_baseline,
                                             tau=p.tau_rate, min_n=p.min_requests)  # fmt: skip
        self.pairs: PairedAnalysis | None = None
        if pairs is not None:  # one budget: a sixth to each unpaired check, the rest to the paired ones
            self.pairs = PairedAnalysis(pairs, alpha=p.alpha * 4 / 6)
        else:
            self._checks["relevance"] = _Check("relevance", Evidence("lower_is_worse", p.tau_relevance))
            self._checks["output_drift"] = _Check(
                "output_drift", Evidence("lower_is_worse", p.tau_similarity)
            )
            self._checks["output_length"] = _Check("output_length", Evidence("either", p.tau_length))
        self._reference_sum: list[float] | None = None  # sum of the stable's baseline embeddings
        self._reference_n = 0
        self._reference: list[float] | None = None  # their mean, unit norm, once fixed
        self._pending_outputs: list[tuple[bool, list[float]]] = []  # canary answers before that
        self._alpha = p.alpha / (len(self._checks) + 2 + (4 if self.pairs is not None else 0))
        self.step = 0
        self.at_step = 0  # canary requests observed at the current step
        self.first_regression: CheckState | None = None

    @property
    def weight(self) -> float:
        return self.policy.steps[self.step]

    def observe(
        self,
        canary: bool,
        *,
        error_type: str | None,
        latency_s: float | None,
        output_tokens: int | None = None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        stream: bool | None = None,
    ) -> None:
        """One finished (or failed) request of the canary (True) or the stable version (False);
        its shape (token counts, `max_tokens`, stream flag) places it in a stratum of like
        requests for the server-error and latency checks."""
        if error_type is not None:  # an engine event's class name, or a stored label
            error_type = engine_label(error_type)
            if not is_server_error(error_type):
                # the caller's doing (client error, hang-up) or the service protecting itself
                # (shed, overloaded: a burst on this arm fills its queue, not a failure of
                # the version): says nothing about either version
                return
        if canary:
            self.at_step += 1
        key = request_shape(max_tokens, stream)  # strata by what was asked (a failure has no lengths)
        regressed = self._errors.add(canary, error_type is not None, key, alpha=self._alpha)
        if regressed and self.first_regression is None:
            self.first_regression = self._errors_state()
        if error_type is None and latency_s is not None:
            key = shape(output_tokens, prompt_tokens, max_tokens, stream)
            if self._latency.add(canary, latency_s, key, alpha=self._alpha) and self.first_regression is None:
                self.first_regression = self._latency_state()
        if error_type is None and output_tokens is not None and self.pairs is None:
            self._add("output_length", canary, float(output_tokens), pooled=False)

    def observe_pair(self, pair: PairOutcome) -> None:
        """One request answered by both (the canary is `pair.candidate`), scored."""
        if self.pairs is not None:
            self.pairs.observe(pair)

    def observe_relevance(self, canary: bool, relevance: float) -> None:
        """The relevance of one answer to its prompt (scored later, on a sample; unpaired only)."""
        if self.pairs is None:
            self._add("relevance", canary, float(relevance), pooled=False)

    def observe_output(self, canary: bool, embedding: Sequence[float]) -> None:
        """The unit-norm embedding of one answer (scored later, on a sample; unpaired only)."""
        if self.pairs is not None:
            return
        vector = [float(x) for x in embedding]
        if self._reference is None:
            if canary:
                self._pending_outputs.append((canary, vector))
                return
            total = self._reference_sum or [0.0] * len(vector)
            self._reference_sum = [a + b for a, b in zip(total, vector, strict=True)]
            self._reference_n += 1
            if self._reference_n < self.policy.drift_baseline:
                return
            norm = math.sqrt(sum(x * x for x in self._reference_sum)) or 1.0
            self._reference = [x / norm for x in self._reference_sum]
            pending, self._pending_outputs = self._pending_outputs, []
            for arm, v in pending:
                self._add("output_drift", arm, _dot(self._reference, v), pooled=False)
            return
        self._add("output_drift", canary, _dot(self._reference, vector), pooled=False)

    def _add(self, name: str, canary: bool, x: float, *, pooled: bool) -> None:
        check = self._checks[name]
        was = check.regressed
        check.add(canary, x, alpha=self._alpha, min_n=self.policy.min_requests, pooled=pooled)
        if check.regressed and not was and self.first_regression is None:
            self.first_regression = check.state()

    def _errors_state(self) -> CheckState:
        c, st, nc, ns = self._errors.figures()
        e = self._errors.evidence
        return CheckState("server_errors", c, st, nc, ns, e.max_lambda, e.p_value, e.regressed)

    def _latency_state(self) -> CheckState:
        c, st, nc, ns = self._latency.figures()
        e = self._latency.evidence
        return CheckState("latency", c, st, nc, ns, e.max_lambda, e.p_value, e.regressed)

    def checks(self) -> tuple[CheckState, ...]:
        return (self._errors_state(), self._latency_state(), *(c.state() for c in self._checks.values()))

    def verdict(self) -> Verdict:
        """Where the canary stands now; a pure read of the observations so far."""
        checks = self.checks()
        if self.first_regression is not None:
            first = self.first_regression
            return Verdict("rollback", 0.0, f"regression on {first.describe()}", checks)
        paired = self.pairs
        if paired is not None and paired.first_regression is not None:
            reason = f"paired regression: {paired.first_regression.describe()} ({paired.pairs} pairs)"
            return Verdict("rollback", 0.0, reason, checks)
        if self.at_step >= self.policy.requests_per_step:
            short = self._evidence_short(checks)
            if short:  # a step's count is not enough: the checks must have been able to decide
                return Verdict("continue", self.weight, f"holding at {self.weight:.0%}: {short}", checks)
            nxt = self.policy.steps[min(self.step + 1, len(self.policy.steps) - 1)]
            figures = "; ".join(c.describe() for c in checks)
            if paired is not None:
                figures += f"; {paired.summary()}"
            return Verdict(
                "promote",
                nxt,
                f"{self.at_step} canary requests at {self.weight:.0%}, no regression ({figures})",
                checks,
            )
        return Verdict("continue", self.weight, "collecting", checks)

    def _evidence_short(self, checks: tuple[CheckState, ...]) -> str:
        """Why the checks could not have decided yet ("" when they could): a step is left only
        when they could, as Flagger halts advancement without metrics. Paired: `min_pairs`
        pairs, and as many scored pairs once scores arrive. Arm against arm: `min_requests`
        per arm, and as many relevance scores per arm once scores arrive."""
        paired = self.pairs
        if paired is not None:
            need = paired.policy.min_pairs
            if paired.pairs < need:
                return f"{paired.pairs} of {need} pairs so far"
            for check in paired.checks():
                if check.name in ("relevance", "similarity", "divergence") and 0 < check.pairs < need:
                    return f"{check.pairs} of {need} pairs scored for {check.name}"
            for check in paired.checks():  # a check without figures (no log-probs) holds nothing
                decided = check.regressed or check.cleared or check.pairs == 0
                if (
                    check.name in paired.policy.decide
                    and not decided
                    and paired.pairs < paired.policy.max_pairs
                ):
                    return (f"{check.name} not decided after {check.pairs} pairs "
                            f"(mean {check.mean:.3g} against {check.null:g})")  # fmt: skip
            return ""
        need = self.policy.min_requests
        for c in checks:
            scored = c.name == "server_errors" or (c.name == "relevance" and c.canary_n + c.stable_n > 0)
            if scored and min(c.canary_n, c.stable_n) < need:
                return f"{c.name}: canary n={c.canary_n}, stable n={c.stable_n}, {need} per arm needed"
        return ""

    def advance(self) -> None:
        """The promotion was applied: the next step starts counting."""
        self.step = min(self.step + 1, len(self.policy.steps) - 1)
        self.at_step = 0


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


class CanaryRuntime(Protocol):
    """What the controller needs of `Runtime.canary` (engine/runtime_canary.py)."""

    @property
    def status(self) -> Any: ...

    def set_weight(self, weight: float) -> Any: ...

    def promote(self, message: str = "") -> Any: ...

    def abort(self, message: str = "") -> Any: ...


_MAX_SHAPES = 10_000  # requests in flight whose shape the controller holds


@dataclass(frozen=True)
class CanaryDecision:
    """A decision applied: what, to which versions, why (the check and its figures)."""

    action: Literal["promote", "rollback"]
    version: str
    stable_version: str
    weight: float
    reason: str
    canary_requests: int
    stable_requests: int
    at: float
    started_at: float | None = None  # when the canary started (the runtime's): its episode


class CanaryController:
    """Feeds one canary's analysis from the engine's events and the sampled relevance
    scores, and applies each decision as soon as an observation makes it: the next step
    of weight, the promotion, or the rollback at the first significant regression.
    `on_decision` is called with every decision: after a step or a promotion is applied, and
    before a rollback is performed (the service raises the alert from it first)."""

    def __init__(
        self,
        control: CanaryRuntime,
        policy: CanaryPolicy | None = None,
        *,
        on_decision: Callable[[CanaryDecision], None] | None = None,
        clock: Callable[[], float] | None = None,
        pairs: PairPolicy | None = None,
        rollback: Callable[[CanaryDecision], None] | None = None,
    ) -> None:
        """`pairs`: the runtime pairs requests (engine/runtime_shadow.py), fed by `on_pair`:
        the quality checks are paired ones (None: arm against arm, as without pairs).
        `rollback`: performs a rollback decision (the service's: the action runner, once per
        canary), called after `on_decision` has raised its alert; None: `control.abort`."""
        import time

        self.control = control
        self.policy = policy or CanaryPolicy()
        self.pair_policy = pairs
        self.on_decision = on_decision
        self.rollback = rollback
        self.clock = clock or time.time
        self.analysis: CanaryAnalysis | None = None
        self.version: str | None = None
        self.stable: str | None = None
        self.served = {True: 0, False: 0}  # requests each arm served during the canary
        self.decisions: list[CanaryDecision] = []
        # request ids running on each arm, and those that ran beside one of the other arm
        self._running: dict[bool, set[str]] = {True: set(), False: set()}
        self._overlapped: set[str] = set()
        self._lock = threading.Lock()
        self._busy = False
        self._shapes: dict[str, tuple[int | None, bool | None]] = {}  # request id -> (max_tokens, stream)

    def begin(self, version: str, stable: str, weight: float) -> None:
        """A canary of `version` against `stable` started at `weight`: a fresh analysis
        whose steps are `weight`, then the policy's steps above it."""
        import dataclasses

        steps = (weight, *(s for s in self.policy.steps if s > weight))
        with self._lock:
            self.analysis = CanaryAnalysis(
                dataclasses.replace(self.policy, steps=steps), pairs=self.pair_policy
            )
            self.version, self.stable = version, stable
            self.served = {True: 0, False: 0}
            self._running, self._overlapped = {True: set(), False: set()}, set()
            self._shapes = {}

    def end(self) -> None:
        """The canary ended by hand (promoted or aborted by an operator): stop analysing."""
        with self._lock:
            self.analysis = None

    def note_shape(self, request_id: str, max_tokens: int | None, stream: bool | None) -> None:
        """What a request asked (the engine's events do not say), before it is submitted: its
        outcome is then compared within its stratum. Kept only while a canary runs, bounded."""
        with self._lock:
            if self.analysis is None:
                return
            if len(self._shapes) >= _MAX_SHAPES:  # requests refused before they ran: the oldest go
                del self._shapes[next(iter(self._shapes))]
            self._shapes[request_id] = (max_tokens, stream)

    def _arm(self, version: str | None) -> bool | None:
        if self.analysis is None or version is None:
            return None
        return True if version == self.version else False if version == self.stable else None

    def on_event(self, event: Any) -> None:
        """Engine subscriber: cheap (a lock and a few adds); decisions run on another thread."""
        kind = type(event).__name__
        if kind not in ("RequestStarted", "RequestFinished", "RequestFailed"):
            return
        with self._lock:
            arm = self._arm(event.model_version)
            if arm is None or self.analysis is None:
                return
            rid = event.request_id
            if kind == "RequestStarted":
                self._running[arm].add(rid)
                if self._running[not arm]:  # these ran beside each other
                    self._overlapped.add(rid)
                    self._overlapped.update(self._running[not arm])
                return
            self._running[arm].discard(rid)
            beside = rid in self._overlapped
            self._overlapped.discard(rid)
            self.served[arm] += 1
            max_tokens, stream = self._shapes.pop(rid, (None, None))
            if kind == "RequestFinished":
                error = "cancelled" if event.finish_reason == "cancelled" else None
                others = getattr(event, "others_s", 0.0) if self.policy.latency == "own" else 0.0
                self.analysis.observe(arm, error_type=error, latency_s=event.duration_s - others if beside else None,
                                      output_tokens=event.output_tokens, prompt_tokens=getattr(event, "prompt_tokens", None),
                                      max_tokens=max_tokens, stream=stream)  # fmt: skip
            else:
                self.analysis.observe(arm, error_type=event.error_type, latency_s=None, max_tokens=max_tokens,
                                      stream=stream)  # fmt: skip
        self._maybe_decide()

    def on_relevance(self, version: str, value: float) -> None:
        with self._lock:
            arm = self._arm(version)
            if arm is None or self.analysis is None:
                return
            self.analysis.observe_relevance(arm, value)
        self._maybe_decide()

    def on_output(self, version: str, embedding: Sequence[float]) -> None:
        with self._lock:
            arm = self._arm(version)
            if arm is None or self.analysis is None:
                return
            self.analysis.observe_output(arm, embedding)
        self._maybe_decide()

    def on_pair(self, pair: PairOutcome) -> None:
        """A scored pair (the monitor's pair feed); one of another canary is ignored."""
        with self._lock:
            if self.analysis is None or (pair.candidate, pair.baseline) != (self.version, self.stable):
                return
            self.analysis.observe_pair(pair)
        self._maybe_decide()

    def replay(self, rows: Iterable[StoredRequest]) -> int:
        """Feed the analysis begun by `begin` with the requests stored since the canary
        started, oldest first (a restarted service resumes the canary with its evidence,
        not a fresh test); decides once, after the last. -> the rows fed."""
        n = 0
        with self._lock:
            for row in rows:
                arm = self._arm(row.version)
                if arm is None or self.analysis is None:
                    continue
                self.served[arm] += 1
                # no latency: the store does not say which requests ran beside the other arm
                self.analysis.observe(arm, error_type=row.error_type, latency_s=None, output_tokens=row.output_tokens,
                                      max_tokens=row.max_tokens, stream=row.stream)  # fmt: skip
                if row.relevance is not None:
                    self.analysis.observe_relevance(arm, row.relevance)
                n += 1
        self._maybe_decide()
        return n

    def _maybe_decide(self) -> None:
        with self._lock:
            if self.analysis is None or self._busy or self.analysis.verdict().action == "continue":
                return
            self._busy = True
        threading.Thread(target=self._decide, name="infersight-canary", daemon=True).start()

    def _decide(self) -> None:
        try:
            with self._lock:
                analysis, version, stable = self.analysis, self.version, self.stable
                if analysis is None or version is None or stable is None:
                    return
                verdict = analysis.verdict()
                served = dict(self.served)
            if verdict.action == "continue":
                return
            status = self.control.status
            if status is None or status.version != version:  # ended by someone else (an operator, a rule)
                self.end()
                return
            decision = CanaryDecision(
                "rollback" if verdict.action == "rollback" else "promote", version, stable, verdict.weight,
                verdict.reason, served[True], served[False], self.clock(), getattr(status, "started_at", None),
            )  # fmt: skip
            if verdict.action == "rollback":
                # one path: the decision is recorded and its alert raised first, then the
                # action (the action runner's, when wired) ends the canary
                with self._lock:
                    self.analysis = None
                self.decisions.append(decision)
                if self.on_decision is not None:
                    self.on_decision(decision)
                if self.rollback is not None:
                    self.rollback(decision)
                else:
                    self.control.abort(f"canary rolled back: {verdict.reason}")
                return
            if verdict.weight >= 1.0:
                self.control.promote(f"canary promoted: {verdict.reason}")
                with self._lock:
                    self.analysis = None
            else:
                self.control.set_weight(verdict.weight)
                with self._lock:
                    analysis.advance()
            self.decisions.append(decision)
            if self.on_decision is not None:
                self.on_decision(decision)
        finally:
            with self._lock:
                self._busy = False
            self._maybe_decide()  # a later step may already be due

    @property
    def share_served(self) -> float:
        """The canary's share of the requests served since it started."""
        total = self.served[True] + self.served[False]
        return self.served[True] / total if total else 0.0
